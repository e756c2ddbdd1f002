//! `sluice-functions`: JavaScript server functions, run by an embedded QuickJS engine.
//!
//! A module's exported functions `(tx, args)` run as transactions: the `tx` handle reads and
//! writes through an engine transaction; returning commits, throwing rolls back. This crate
//! owns the JavaScript side — loading and replacing modules, the `tx` host functions, moving
//! values between Rust and JS as native values (never JSON text), determinism (no clock or
//! randomness except `tx.now()` / `tx.random()`), and the time and memory limits.
//!
//! # Callers
//! Every call names its caller: `None` for the admin token, else the client's
//! `{"sub", "claims"}`, which the function reads as `tx.auth` (`null` for the admin). The
//! object is deep-frozen and rebuilt for every call, and `tx` itself is frozen, so nothing a
//! function does changes what a later call sees. An export named `allow` is the module's
//! rule for clients: `allow(auth, name, args)` runs before a client's call (within the same
//! time and memory limits, without `tx`) and anything but `true` refuses it
//! ([`FunctionError::Forbidden`]). `allow` itself is not callable; a module without it lets
//! clients call nothing; the admin skips it. To a client, an unknown name is refused like a
//! disallowed one, so clients cannot probe which functions exist.
//!
//! The exported functions (and `allow`) are resolved once, when the module loads: a call
//! finds its function by name among them, so a module that later reassigns one of its own
//! exported bindings does not change which function a call runs.
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

use rquickjs::{
    CatchResultExt, CaughtError, Context, Function, IntoJs, Module, Object, Persistent, Runtime,
};
use sluice_engine::TxRef;

mod convert;
mod host;
pub mod msgpack;
pub use msgpack::{Args, Msgpack};
// The one module with unsafe code: QuickJS C functions over raw values (see its docs).
#[allow(unsafe_code)]
mod raw;

/// Name the module is compiled under (appears in stack traces and compile errors).
pub const MODULE_NAME: &str = "app.js";
/// The export that decides which client may call which function; never callable itself.
pub const ALLOW_EXPORT: &str = "allow";

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
    /// A client may not call this function: the module has no `allow` export, `allow`
    /// returned something other than `true` or threw, or (for a client) no such function
    /// exists. The message names the function and, if `allow` threw, what it threw.
    #[error("{0}")]
    Forbidden(String),
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
/// The caller of the call in progress as `tx.auth` returns it (`None`: the admin, `null`).
type AuthSlot = Rc<RefCell<Option<Persistent<rquickjs::Value<'static>>>>>;

/// What calls need of a loaded module, resolved once at load (nothing is looked up by name
/// in the mutable global object per call).
struct Loaded {
    /// The `tx` object (frozen).
    tx: Persistent<Object<'static>>,
    /// The callable exports, in the order of [`Functions::exports`] (sorted by name):
    /// resolved once at load, like `allow`, so a call looks its function up by a binary
    /// search of the names and not through the namespace object.
    functions: Vec<Persistent<Function<'static>>>,
    /// The `allow` export, if the module has one.
    allow: Option<Persistent<Function<'static>>>,
    /// The realm's own `Object.freeze`, taken before the module ran.
    freeze: Persistent<Function<'static>>,
    /// Column names cached by the `tx` host functions (which hold it too).
    columns: Rc<RefCell<host::Columns>>,
    /// The state of the raw `tx.get` / `tx.patch`: it holds atoms and values of `context`.
    _raw: Rc<raw::Raw>,
    /// Declared last: dropped after the values above that live in it.
    context: Context,
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // The cached names hold the context and are held by its host functions: without
        // this, the context would never be freed.
        self.columns.borrow_mut().clear();
    }
}

/// A loaded module and the engine that runs it. Not `Send`: keep it on one thread.
pub struct Functions {
    /// Declared before `runtime`: no value may outlive the runtime.
    loaded: Option<Loaded>,
    exports: Vec<String>,
    slot: Slot,
    auth: AuthSlot,
    deadline: Rc<Cell<Option<Instant>>>,
    rng: Rc<Cell<u64>>,
    /// Whether `tx.get` / `tx.patch` serve their common calls in raw QuickJS calls (see
    /// `raw`); off only in tests that compare the two paths.
    raw_calls: Rc<Cell<bool>>,
    limits: FunctionLimits,
    runtime: Runtime,
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
            loaded: None,
            exports: Vec::new(),
            slot: Rc::new(RefCell::new(None)),
            auth: Rc::new(RefCell::new(None)),
            deadline,
            rng: Rc::new(Cell::new(0)),
            raw_calls: Rc::new(Cell::new(true)),
            limits,
            runtime,
        })
    }

    /// Names of the callable exported functions of the loaded module (not `allow`).
    pub fn exports(&self) -> &[String] {
        &self.exports
    }

    /// Whether the loaded module exports an `allow` function (else clients call nothing).
    /// Turns the raw fast paths of `tx.get` and `tx.patch` off (every call then takes the
    /// general path) or back on. For tests that hold the two to the same answers.
    #[doc(hidden)]
    pub fn set_raw_host_calls(&mut self, on: bool) {
        self.raw_calls.set(on);
    }

    pub fn has_allow(&self) -> bool {
        self.loaded.as_ref().is_some_and(|l| l.allow.is_some())
    }

    /// Compiles and evaluates `source` as an ES module in a fresh context and, if that
    /// works, makes it the module calls run against. On error the previous module stays.
    pub fn load(&mut self, source: &str) -> Result<&[String], FunctionError> {
        let context =
            Context::full(&self.runtime).map_err(|e| FunctionError::Value(e.to_string()))?;
        self.deadline
            .set(Some(Instant::now() + self.limits.time_max));
        let slot = self.slot.clone();
        let auth = self.auth.clone();
        let rng = self.rng.clone();
        let columns: Rc<RefCell<host::Columns>> = Rc::default();
        let host_columns = columns.clone();
        // Declared after `context`, so dropped before it when loading fails.
        let raw = context.with(|ctx| {
            Rc::new(raw::Raw::new(
                &ctx,
                self.slot.clone(),
                self.raw_calls.clone(),
            ))
        });
        let host_raw = raw.clone();
        let loaded = context.with(|ctx| {
            ctx.eval::<(), _>(PRELUDE)
                .catch(&ctx)
                .map_err(|e| compile_error(e))?;
            let freeze: Function = ctx
                .globals()
                .get::<_, Object>("Object")
                .and_then(|o| o.get("freeze"))
                .map_err(|e| FunctionError::Value(e.to_string()))?;
            let tx = host::install(&ctx, slot, auth, rng, host_columns, host_raw)
                .map_err(|e| FunctionError::Value(e.to_string()))?;
            let (module, promise) = Module::declare(ctx.clone(), MODULE_NAME, source)
                .catch(&ctx)
                .map_err(compile_error)?
                .eval()
                .catch(&ctx)
                .map_err(compile_error)?;
            promise.finish::<()>().catch(&ctx).map_err(compile_error)?;
            let namespace: Object = module.namespace().catch(&ctx).map_err(compile_error)?;
            let mut names: Vec<(String, Persistent<Function<'static>>)> = Vec::new();
            let mut allow = None;
            for key in namespace.keys::<String>() {
                let key = key.map_err(|e| FunctionError::Value(e.to_string()))?;
                let value: rquickjs::Value = namespace
                    .get(key.as_str())
                    .map_err(|e| FunctionError::Value(e.to_string()))?;
                if let Some(function) = value.as_function() {
                    if key == ALLOW_EXPORT {
                        allow = Some(Persistent::save(&ctx, function.clone()));
                    } else {
                        names.push((key, Persistent::save(&ctx, function.clone())));
                    }
                }
            }
            names.sort_by(|a, b| a.0.cmp(&b.0));
            let persisted = (
                Persistent::save(&ctx, tx),
                allow,
                Persistent::save(&ctx, freeze),
            );
            Ok::<_, FunctionError>((names, persisted))
        });
        self.deadline.set(None);
        let (names, (tx, allow, freeze)) = loaded?;
        let (names, functions): (Vec<String>, Vec<_>) = names.into_iter().unzip();
        self.loaded = Some(Loaded {
            tx,
            functions,
            allow,
            freeze,
            columns,
            _raw: raw,
            context,
        });
        self.exports = names;
        Ok(&self.exports)
    }

    /// Calls export `name` with `args` for `auth`, lending it `access` for the call. Returns
    /// `access` back (the caller commits on `Ok`, rolls back on `Err`) and the function's result.
    ///
    /// `auth` is `None` for the admin token, else the client as `{"sub", "claims"}`: the
    /// function sees it as `tx.auth`, and a client's call runs only if the module's `allow`
    /// returns `true` for it (else [`FunctionError::Forbidden`], and `access` is untouched).
    pub fn call<A: TxAccess>(
        &mut self,
        name: &str,
        args: &serde_json::Value,
        auth: Option<&serde_json::Value>,
        access: A,
    ) -> (A, Result<serde_json::Value, FunctionError>) {
        self.call_with(name, msgpack::ArgsRef::Json(args), auth, access)
    }

    /// [`Functions::call`] with arguments that may be MessagePack bytes ([`Args`]): the
    /// function sees the same value as with their JSON.
    pub fn call_args<A: TxAccess>(
        &mut self,
        name: &str,
        args: &Args,
        auth: Option<&serde_json::Value>,
        access: A,
    ) -> (A, Result<serde_json::Value, FunctionError>) {
        self.call_with(name, args.into(), auth, access)
    }

    fn call_with<A: TxAccess>(
        &mut self,
        name: &str,
        args: msgpack::ArgsRef,
        auth: Option<&serde_json::Value>,
        access: A,
    ) -> (A, Result<serde_json::Value, FunctionError>) {
        let Some(loaded) = &self.loaded else {
            return (access, Err(refusal(name, auth.is_some(), false)));
        };
        if auth.is_some() && loaded.allow.is_none() {
            return (access, Err(refusal(name, true, false)));
        }
        let Ok(export) = self.exports.binary_search_by(|e| e.as_str().cmp(name)) else {
            return (access, Err(refusal(name, auth.is_some(), true)));
        };
        self.rng.set(0);
        let started = Instant::now();
        self.deadline.set(Some(started + self.limits.time_max));
        let limits = self.limits;
        let auth_slot = &self.auth;
        let context = &loaded.context;

        if let Some(auth) = auth {
            // The caller as `tx.auth` and `allow`'s first argument: one deep-frozen object.
            let allowed = context.with(|ctx| -> Result<(), FunctionError> {
                let freeze = restore(&ctx, &loaded.freeze)?;
                let auth_js = convert::json_to_frozen_js(&ctx, auth, &freeze)
                    .map_err(|e| FunctionError::Value(format!("auth: {e}")))?;
                *auth_slot.borrow_mut() = Some(Persistent::save(&ctx, auth_js.clone()));
                let allow = match &loaded.allow {
                    Some(allow) => restore(&ctx, allow)?,
                    None => return Err(refusal(name, true, false)),
                };
                // `allow` gets its own copy of the arguments: it cannot change the function's.
                let allow_args = raw::args_to_js(&ctx, args, false)
                    .map_err(|e| FunctionError::Value(format!("args: {e}")))?;
                let name_js = name
                    .into_js(&ctx)
                    .map_err(|e| FunctionError::Value(e.to_string()))?;
                let verdict: rquickjs::Value = allow
                    .call((auth_js, name_js, allow_args))
                    .catch(&ctx)
                    .map_err(|e| match call_error(e, started, limits) {
                        FunctionError::Thrown(thrown) => FunctionError::Forbidden(format!(
                            "clients may not call {name:?}: allow threw: {thrown}"
                        )),
                        other => other,
                    })?;
                match verdict.as_bool() {
                    Some(true) => Ok(()),
                    _ => Err(refusal(name, true, true)),
                }
            });
            if let Err(e) = allowed {
                self.deadline.set(None);
                context.with(|_| auth_slot.borrow_mut().take());
                if !matches!(e, FunctionError::Forbidden(_)) {
                    // Reclaim what a failed (e.g. out-of-memory) `allow` left behind; a plain
                    // refusal does not pay for a collection.
                    self.runtime.run_gc();
                }
                return (access, Err(e));
            }
        }

        *self.slot.borrow_mut() = Some(Box::new(access));
        let result = context.with(|ctx| {
            let result = (|| -> Result<serde_json::Value, FunctionError> {
                let function = restore(&ctx, &loaded.functions[export])?;
                let tx = restore(&ctx, &loaded.tx)?;
                let js_args = raw::args_to_js(&ctx, args, true)
                    .map_err(|e| FunctionError::Value(format!("args: {e}")))?;
                let out: rquickjs::Value = function
                    .call((tx, js_args))
                    .catch(&ctx)
                    .map_err(|e| call_error(e, started, limits))?;
                convert::js_to_json(&out, 0)
                    .map_err(|e| FunctionError::Value(format!("result: {e}")))
            })();
            // The caller is this call's only: a later call (or a stashed `tx`) sees its own.
            auth_slot.borrow_mut().take();
            result
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

/// A persisted value of the loaded module, in this call's context.
fn restore<'js, T>(
    ctx: &rquickjs::Ctx<'js>,
    value: &Persistent<T>,
) -> Result<T::Changed<'js>, FunctionError>
where
    T: Clone + rquickjs::JsLifetime<'static>,
{
    value
        .clone()
        .restore(ctx)
        .map_err(|e| FunctionError::Value(e.to_string()))
}

/// Why `name` was not called: for the admin, only an unknown name (`NotFound`); for a client
/// the same `Forbidden` whether the name is unknown or `allow` refused it, so a client
/// cannot tell which functions exist.
fn refusal(name: &str, client: bool, has_allow: bool) -> FunctionError {
    if !client {
        FunctionError::NotFound(name.to_string())
    } else if has_allow {
        FunctionError::Forbidden(format!(
            "clients may not call {name:?}: allow(auth, name, args) did not return true"
        ))
    } else {
        FunctionError::Forbidden(format!(
            "clients may not call {name:?}: the module exports no allow function, so clients may call none"
        ))
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
