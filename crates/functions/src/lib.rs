//! `sluice-functions`: JavaScript server functions, run by an embedded QuickJS engine.
//!
//! A module's exported functions `(tx, args)` run as transactions: the `tx` handle reads and
//! writes through an engine transaction; returning commits, throwing rolls back. This crate
//! owns the JavaScript side — loading and replacing modules, the `tx` host functions, moving
//! values between Rust and JS as native values (never JSON text), determinism (no clock or
//! randomness except `tx.now()` / `tx.random()`), and the time and memory limits.
//!
//! It is *not* responsible for threads or locks. QuickJS is not `Send`, so a [`Functions`]
//! lives on one thread — in the server, the writer thread, which is also the only thread
//! that mutates the database, so a function is simply one more serial transaction. The
//! caller lends the transaction for the duration of a call through [`TxAccess`].
//!
//! # Layout
//! - [`Functions`]: load / replace a module, call an export.
//! - `convert`: JS value <-> `serde_json::Value` / engine `Value`, natively.
//! - `host`: the `tx` object and its host functions.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use rquickjs::{CatchResultExt, CaughtError, Context, Function, Module, Object, Runtime};
use sluice_engine::TxRef;

mod convert;
mod host;

/// Name under which the loaded module's namespace is kept in the JS global object.
const EXPORTS_GLOBAL: &str = "__sluice_exports";
/// Name the module is compiled under (appears in stack traces and compile errors).
pub const MODULE_NAME: &str = "app.js";

/// What a function call may use of the world: the transaction, and the deterministic
/// stand-ins for the clock and randomness.
pub trait TxAccess: std::any::Any {
    /// The transaction's ops.
    fn tx(&mut self) -> TxRef<'_>;
    /// The transaction's timestamp (µs since the epoch), fixed for the whole call.
    fn now_us(&self) -> i64;
    /// Seed for `tx.random()`; the same for every replay of this transaction.
    fn seed(&self) -> u64;
}

/// Limits of one call; each is named in the error that enforces it.
#[derive(Clone, Copy, Debug)]
pub struct FunctionLimits {
    /// Wall time of one call (`--function-time-ms`).
    pub time_max: Duration,
    /// Memory of the JavaScript heap (`--function-memory-bytes`).
    pub memory_bytes_max: usize,
}

impl Default for FunctionLimits {
    fn default() -> Self {
        FunctionLimits {
            time_max: Duration::from_millis(1000),
            memory_bytes_max: 64 << 20,
        }
    }
}

/// Why a module was refused or a call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FunctionError {
    /// The module does not compile or its top level throws; the old module stays.
    #[error("module does not load: {message}")]
    Compile { message: String, line: Option<u32> },
    #[error("no function named {0:?} is exported")]
    NotFound(String),
    /// The function threw (or a `tx` op it did not catch failed): rolled back.
    #[error("{0}")]
    Thrown(String),
    #[error("function exceeded function_time_max (--function-time-ms) of {0} ms and was stopped")]
    Timeout(u64),
    #[error("function exceeded function_memory_max (--function-memory-bytes) of {0} bytes")]
    OutOfMemory(usize),
    /// Arguments or the result could not cross between JSON and JavaScript.
    #[error("{0}")]
    Value(String),
}

type Slot = Rc<RefCell<Option<Box<dyn TxAccess>>>>;

/// A loaded module and the engine that runs it. Not `Send`: keep it on one thread.
pub struct Functions {
    runtime: Runtime,
    context: Option<Context>,
    exports: Vec<String>,
    slot: Slot,
    deadline: Rc<Cell<Option<Instant>>>,
    rng: Rc<Cell<u64>>,
    limits: FunctionLimits,
}

/// Makes the global environment deterministic: no clock, no randomness but `tx`'s.
const PRELUDE: &str = r#"
Math.random = function () { throw new Error("Math.random is not deterministic: use tx.random()"); };
Date.now = function () { throw new Error("Date.now reads the clock: use tx.now()"); };
(function () {
  const RealDate = Date;
  function SluiceDate(...args) {
    if (args.length === 0) throw new Error("new Date() reads the clock: use new Date(tx.now() / 1000)");
    return new RealDate(...args);
  }
  SluiceDate.prototype = RealDate.prototype;
  SluiceDate.UTC = RealDate.UTC;
  SluiceDate.parse = RealDate.parse;
  SluiceDate.now = Date.now;
  globalThis.Date = SluiceDate;
})();
"#;

impl Functions {
    pub fn new(limits: FunctionLimits) -> Result<Self, FunctionError> {
        let runtime = Runtime::new().map_err(|e| FunctionError::Value(e.to_string()))?;
        runtime.set_memory_limit(limits.memory_bytes_max);
        runtime.set_max_stack_size(1 << 20);
        let deadline: Rc<Cell<Option<Instant>>> = Rc::new(Cell::new(None));
        let handler_deadline = deadline.clone();
        runtime.set_interrupt_handler(Some(Box::new(move || {
            handler_deadline.get().is_some_and(|d| Instant::now() >= d)
        })));
        Ok(Functions {
            runtime,
            context: None,
            exports: Vec::new(),
            slot: Rc::new(RefCell::new(None)),
            deadline,
            rng: Rc::new(Cell::new(0)),
            limits,
        })
    }

    /// Names of the exported functions of the loaded module.
    pub fn exports(&self) -> &[String] {
        &self.exports
    }

    /// Compiles and evaluates `source` as an ES module in a fresh context and, if that
    /// works, makes it the module calls run against. On error the previous module stays.
    pub fn load(&mut self, source: &str) -> Result<&[String], FunctionError> {
        let context =
            Context::full(&self.runtime).map_err(|e| FunctionError::Value(e.to_string()))?;
        self.deadline
            .set(Some(Instant::now() + self.limits.time_max));
        let slot = self.slot.clone();
        let rng = self.rng.clone();
        let loaded = context.with(|ctx| -> Result<Vec<String>, FunctionError> {
            ctx.eval::<(), _>(PRELUDE)
                .catch(&ctx)
                .map_err(|e| compile_error(e))?;
            host::install(&ctx, slot, rng).map_err(|e| FunctionError::Value(e.to_string()))?;
            let (module, promise) = Module::declare(ctx.clone(), MODULE_NAME, source)
                .catch(&ctx)
                .map_err(compile_error)?
                .eval()
                .catch(&ctx)
                .map_err(compile_error)?;
            promise.finish::<()>().catch(&ctx).map_err(compile_error)?;
            let namespace: Object = module.namespace().catch(&ctx).map_err(compile_error)?;
            let mut names = Vec::new();
            for key in namespace.keys::<String>() {
                let key = key.map_err(|e| FunctionError::Value(e.to_string()))?;
                let value: rquickjs::Value = namespace
                    .get(key.as_str())
                    .map_err(|e| FunctionError::Value(e.to_string()))?;
                if value.is_function() {
                    names.push(key);
                }
            }
            ctx.globals()
                .set(EXPORTS_GLOBAL, namespace)
                .map_err(|e| FunctionError::Value(e.to_string()))?;
            names.sort();
            Ok(names)
        });
        self.deadline.set(None);
        let names = loaded?;
        self.context = Some(context);
        self.exports = names;
        Ok(&self.exports)
    }

    /// Calls export `name` with `args`, lending it `access` for the call. Returns `access`
    /// back (the caller commits on `Ok`, rolls back on `Err`) and the function's result.
    pub fn call<A: TxAccess>(
        &mut self,
        name: &str,
        args: &serde_json::Value,
        access: A,
    ) -> (A, Result<serde_json::Value, FunctionError>) {
        let Some(context) = &self.context else {
            return (access, Err(FunctionError::NotFound(name.to_string())));
        };
        if !self.exports.iter().any(|e| e == name) {
            return (access, Err(FunctionError::NotFound(name.to_string())));
        }
        *self.slot.borrow_mut() = Some(Box::new(access));
        self.rng.set(0);
        let started = Instant::now();
        self.deadline.set(Some(started + self.limits.time_max));
        let limits = self.limits;
        let result = context.with(|ctx| -> Result<serde_json::Value, FunctionError> {
            let exports: Object = ctx
                .globals()
                .get(EXPORTS_GLOBAL)
                .map_err(|e| FunctionError::Value(e.to_string()))?;
            let function: Function = exports
                .get(name)
                .map_err(|e| FunctionError::Value(e.to_string()))?;
            let tx: Object = ctx
                .globals()
                .get(host::TX_GLOBAL)
                .map_err(|e| FunctionError::Value(e.to_string()))?;
            let js_args = convert::json_to_js(&ctx, args)
                .map_err(|e| FunctionError::Value(format!("args: {e}")))?;
            let out: rquickjs::Value = function
                .call((tx, js_args))
                .catch(&ctx)
                .map_err(|e| call_error(e, started, limits))?;
            convert::js_to_json(&out, 0).map_err(|e| FunctionError::Value(format!("result: {e}")))
        });
        self.deadline.set(None);
        let lent: Box<dyn std::any::Any> = self
            .slot
            .borrow_mut()
            .take()
            .expect("the slot holds the access during a call");
        let access = *lent
            .downcast::<A>()
            .expect("the slot gives back what was lent");
        if result.is_err() {
            // Reclaim what a failed (e.g. out-of-memory) call left behind.
            self.runtime.run_gc();
        }
        (access, result)
    }
}

fn caught_message(e: &CaughtError<'_>) -> String {
    match e {
        CaughtError::Exception(ex) => {
            let message = ex.message().unwrap_or_default();
            let name: Option<String> = ex.as_object().get("name").ok();
            match name {
                Some(n) if !n.is_empty() && n != "Error" => format!("{n}: {message}"),
                _ => message,
            }
        }
        CaughtError::Value(v) => convert::js_to_json(v, 0)
            .map(|j| match j {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            })
            .unwrap_or_else(|_| "a non-error value was thrown".into()),
        CaughtError::Error(e) => e.to_string(),
    }
}

/// The line of a compile error, from QuickJS's `lineNumber` or the stack (`app.js:LINE`).
fn error_line(e: &CaughtError<'_>) -> Option<u32> {
    let CaughtError::Exception(ex) = e else {
        return None;
    };
    if let Ok(Some(line)) = ex.as_object().get::<_, Option<u32>>("lineNumber") {
        return Some(line);
    }
    let stack = ex.stack()?;
    let at = stack.find(&format!("{MODULE_NAME}:"))? + MODULE_NAME.len() + 1;
    stack[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn compile_error(e: CaughtError<'_>) -> FunctionError {
    let line = error_line(&e);
    let mut message = caught_message(&e);
    if let Some(line) = line {
        message = format!("{message} (line {line})");
    }
    FunctionError::Compile { message, line }
}

/// Classifies a failed call.
///
/// Known gap: when the heap is exhausted by many small allocations, QuickJS cannot even
/// allocate its "out of memory" error and throws a bare `null`, which is indistinguishable
/// here from a script's `throw null` (and the heap is freed again by the time the runtime
/// could be asked), so that case reads as `Thrown("null")`.
fn call_error(e: CaughtError<'_>, started: Instant, limits: FunctionLimits) -> FunctionError {
    let message = caught_message(&e);
    if started.elapsed() >= limits.time_max && message.contains("interrupted") {
        return FunctionError::Timeout(limits.time_max.as_millis() as u64);
    }
    if message.contains("out of memory")
        || matches!(e, CaughtError::Error(rquickjs::Error::Allocation))
    {
        return FunctionError::OutOfMemory(limits.memory_bytes_max);
    }
    FunctionError::Thrown(message)
}
