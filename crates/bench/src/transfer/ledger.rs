//! The bench's own account of every transfer, to check each balance after a run.
//!
//! Every client records each transfer whose success it saw ([`Ledger::acked`]): the
//! expected balance of both accounts moves. A transfer the server refused is left out (a
//! refusal changes nothing). A transfer whose outcome the client cannot know (the
//! connection broke, the reply said the server was stopping or its log failed, the worker
//! was stopped with the request in flight) is *unknown* ([`Ledger::unknown`]); the check
//! then accepts exactly that transfer having applied or not, and nothing else.
//!
//! [`Ledger::check`] compares every account's balance read back from the system with the
//! expected one. With no unknown transfers (the normal case) every balance must be equal.
//! With up to [`UNKNOWN_EXACT_MAX`] unknowns, the differences must be the effect of one
//! subset of them (searched exhaustively); with more, each account's difference must lie
//! within what the unknowns touching it could have done (reported as a bounded check).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// Most unknown transfers resolved exactly (2^N subsets are tried).
pub const UNKNOWN_EXACT_MAX: usize = 20;
/// Mismatching accounts named in a check's detail.
const NAMED_MISMATCHES_MAX: usize = 10;

/// One transfer: `amount` from account `from` to account `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Transfer {
    pub from: u32,
    pub to: u32,
    pub amount: i64,
}

/// Expected balance changes of every account, from the transfers clients saw acknowledged.
#[derive(Debug)]
pub struct Ledger {
    initial_balance: i64,
    /// Net change of account `i` by acknowledged transfers. Relaxed atomics: only the
    /// totals matter, read once every client stopped.
    delta: Vec<AtomicI64>,
    acked: AtomicI64,
    /// Transfers whose outcome is unknown. A std mutex: normally never taken.
    unknown: Mutex<Vec<Transfer>>,
    /// Clients running now; a check while one runs cannot be exact.
    clients_running: AtomicUsize,
}

impl Ledger {
    pub fn new(accounts: u32, initial_balance: i64) -> Arc<Ledger> {
        Arc::new(Ledger {
            initial_balance,
            delta: (0..accounts).map(|_| AtomicI64::new(0)).collect(),
            acked: AtomicI64::new(0),
            unknown: Mutex::new(Vec::new()),
            clients_running: AtomicUsize::new(0),
        })
    }

    pub fn accounts(&self) -> u32 {
        self.delta.len() as u32
    }

    /// Records a transfer the system acknowledged.
    pub fn acked(&self, t: Transfer) {
        // Ids come from the bench's own pairs, always inside 0..accounts.
        self.delta[t.from as usize].fetch_sub(t.amount, Ordering::Relaxed);
        self.delta[t.to as usize].fetch_add(t.amount, Ordering::Relaxed);
        self.acked.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a transfer that may or may not have applied.
    pub fn unknown(&self, t: Transfer) {
        self.unknown.lock().expect("ledger poisoned").push(t);
    }

    pub fn acked_count(&self) -> u64 {
        self.acked.load(Ordering::Relaxed) as u64
    }

    pub fn unknown_count(&self) -> u64 {
        self.unknown.lock().expect("ledger poisoned").len() as u64
    }

    /// A client starts: [`ClientGuard`] records its in-flight transfers as unknown when it
    /// ends, however it ends (done, error, panic, task aborted).
    pub fn client(self: &Arc<Ledger>) -> ClientGuard {
        self.clients_running.fetch_add(1, Ordering::Relaxed);
        ClientGuard {
            ledger: self.clone(),
            in_flight: BTreeMap::new(),
        }
    }

    /// The expected balance of every account.
    pub fn expected(&self) -> Vec<i64> {
        self.delta
            .iter()
            .map(|d| self.initial_balance + d.load(Ordering::Relaxed))
            .collect()
    }

    /// Compares every balance read back (`got[id]`, `None`: the account is missing) and
    /// `extra` ids that should not exist, with the expected balances.
    pub fn check(&self, got: &[Option<i64>], extra: &[i64]) -> AccountCheck {
        let running = self.clients_running.load(Ordering::Relaxed);
        let unknown = self.unknown.lock().expect("ledger poisoned").clone();
        let mut check = check_balances(&self.expected(), got, extra, &unknown);
        check.acked_transfers = self.acked_count();
        if running > 0 {
            check.ok = false;
            check.detail = format!(
                "{running} client(s) still running, the balances may still move; {}",
                check.detail
            );
        }
        check
    }
}

/// One client's transfers in flight, keyed by the client's own request id.
pub struct ClientGuard {
    ledger: Arc<Ledger>,
    in_flight: BTreeMap<u64, Transfer>,
}

impl ClientGuard {
    pub fn sent(&mut self, id: u64, t: Transfer) {
        self.in_flight.insert(id, t);
    }

    /// The reply for `id` came: acknowledged (`true`) or refused (`false`).
    pub fn answered(&mut self, id: u64, acked: bool) {
        if let Some(t) = self.in_flight.remove(&id) {
            if acked {
                self.ledger.acked(t);
            }
        }
    }

    /// The reply for `id` came but does not say whether the transfer applied.
    pub fn unknown(&mut self, id: u64) {
        if let Some(t) = self.in_flight.remove(&id) {
            self.ledger.unknown(t);
        }
    }
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        for (_, t) in std::mem::take(&mut self.in_flight) {
            self.ledger.unknown(t);
        }
        self.ledger.clients_running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The per-account check of one read-back.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AccountCheck {
    /// Accounts expected and compared (every id `0..accounts`).
    pub accounts_checked: u64,
    /// Accounts whose balance is not explained by the acknowledged transfers (and the
    /// unknown ones): missing, different, or not expected at all.
    pub mismatches: u64,
    pub acked_transfers: u64,
    pub unknown_transfers: u64,
    /// Unknown transfers the balances show as applied (exact resolution only).
    pub unknown_applied: Option<u64>,
    /// `exact`: every balance must be explained by one subset of the unknown transfers (or
    /// equal, with none); `bounded`: too many unknowns, each account within their reach.
    pub method: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// The check itself, on plain values: `expected[id]` from acknowledged transfers, `got[id]`
/// read back, `extra` ids read back outside `0..expected.len()`.
pub fn check_balances(
    expected: &[i64],
    got: &[Option<i64>],
    extra: &[i64],
    unknown: &[Transfer],
) -> AccountCheck {
    let mut check = AccountCheck {
        accounts_checked: expected.len() as u64,
        unknown_transfers: unknown.len() as u64,
        method: if unknown.len() <= UNKNOWN_EXACT_MAX {
            "exact"
        } else {
            "bounded"
        },
        ..AccountCheck::default()
    };
    let mut named = Vec::new();
    let name = |s: String, named: &mut Vec<String>| {
        if named.len() < NAMED_MISMATCHES_MAX {
            named.push(s);
        }
    };
    // Differences left to explain by unknown transfers, by account.
    let mut diff: BTreeMap<u32, i64> = BTreeMap::new();
    for (id, &want) in expected.iter().enumerate() {
        match got.get(id).copied().flatten() {
            None => {
                check.mismatches += 1;
                name(
                    format!("account {id}: expected {want}, missing"),
                    &mut named,
                );
            }
            Some(have) if have != want => {
                diff.insert(id as u32, have - want);
            }
            Some(_) => {}
        }
    }
    for id in extra {
        check.mismatches += 1;
        name(format!("account {id}: not expected, present"), &mut named);
    }
    let mut touched: BTreeMap<u32, (i64, i64)> = BTreeMap::new(); // (lowest, highest) reach
    for t in unknown {
        touched.entry(t.from).or_default().0 -= t.amount;
        touched.entry(t.to).or_default().1 += t.amount;
    }
    let show = |id: u32, d: i64| {
        let want = expected[id as usize];
        format!("account {id}: expected {want}, got {}", want + d)
    };
    // Accounts no unknown transfer touched must be exact.
    for (&id, &d) in &diff {
        if !touched.contains_key(&id) {
            check.mismatches += 1;
            name(show(id, d), &mut named);
        }
    }
    if unknown.is_empty() {
        // Nothing more to explain.
    } else if unknown.len() <= UNKNOWN_EXACT_MAX {
        match explain_exactly(&diff, unknown) {
            Some(applied) => check.unknown_applied = Some(applied),
            None => {
                // No subset explains the touched accounts: count each touched account that
                // differs or could not be matched.
                let bad: Vec<u32> = touched.keys().copied().collect();
                check.mismatches += bad.len() as u64;
                name(
                    format!(
                        "no subset of the {} unknown transfer(s) explains the balances of accounts {bad:?} (differences {:?})",
                        unknown.len(),
                        bad.iter().map(|id| diff.get(id).copied().unwrap_or(0)).collect::<Vec<_>>()
                    ),
                    &mut named,
                );
            }
        }
    } else {
        for (&id, &(low, high)) in &touched {
            let d = diff.get(&id).copied().unwrap_or(0);
            if d < low || d > high {
                check.mismatches += 1;
                name(
                    format!(
                        "{} (outside the reach [{low}, {high}] of its unknown transfers)",
                        show(id, d)
                    ),
                    &mut named,
                );
            }
        }
    }
    check.ok = check.mismatches == 0;
    check.detail = if check.ok {
        format!(
            "{} accounts checked ({}), all balances as expected{}",
            check.accounts_checked,
            check.method,
            match (unknown.len(), check.unknown_applied) {
                (0, _) => String::new(),
                (n, Some(a)) => format!("; {a} of {n} unknown transfer(s) applied"),
                (n, None) => format!("; within the reach of {n} unknown transfers"),
            }
        )
    } else {
        format!(
            "{} of {} accounts wrong: {}{}",
            check.mismatches,
            check.accounts_checked,
            named.join("; "),
            if check.mismatches as usize > named.len() {
                "; …"
            } else {
                ""
            }
        )
    };
    check
}

/// The number of unknown transfers applied if one subset of them accounts for exactly
/// `diff` on every account they touch (accounts not in `diff` differ by 0).
fn explain_exactly(diff: &BTreeMap<u32, i64>, unknown: &[Transfer]) -> Option<u64> {
    assert!(unknown.len() <= UNKNOWN_EXACT_MAX, "too many to enumerate");
    let mut ids: Vec<u32> = unknown.iter().flat_map(|t| [t.from, t.to]).collect();
    ids.sort_unstable();
    ids.dedup();
    let target: Vec<i64> = ids
        .iter()
        .map(|id| diff.get(id).copied().unwrap_or(0))
        .collect();
    let index = |id: u32| ids.binary_search(&id).expect("collected above");
    let moves: Vec<(usize, usize, i64)> = unknown
        .iter()
        .map(|t| (index(t.from), index(t.to), t.amount))
        .collect();
    let mut sum = vec![0i64; ids.len()];
    for mask in 0u32..(1u32 << unknown.len()) {
        sum.iter_mut().for_each(|s| *s = 0);
        for (i, &(from, to, amount)) in moves.iter().enumerate() {
            if mask & (1 << i) != 0 {
                sum[from] -= amount;
                sum[to] += amount;
            }
        }
        if sum == target {
            return Some(u64::from(mask.count_ones()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(from: u32, to: u32) -> Transfer {
        Transfer {
            from,
            to,
            amount: 1,
        }
    }

    #[test]
    fn acknowledged_transfers_set_every_expected_balance() {
        let ledger = Ledger::new(4, 100);
        {
            let mut c = ledger.client();
            c.sent(1, t(0, 1));
            c.sent(2, t(0, 2));
            c.sent(3, t(3, 0));
            c.answered(1, true);
            c.answered(2, false); // refused: no change
            c.answered(3, true);
        }
        assert_eq!(ledger.expected(), vec![100, 101, 100, 99]);
        let check = ledger.check(&[Some(100), Some(101), Some(100), Some(99)], &[]);
        assert!(check.ok, "{check:?}");
        assert_eq!((check.accounts_checked, check.acked_transfers), (4, 2));
    }

    #[test]
    fn one_wrong_balance_is_named_with_expected_and_got() {
        let ledger = Ledger::new(3, 100);
        ledger.acked(t(0, 1));
        // The sum is right, two balances are not: a sum check would pass.
        let check = ledger.check(&[Some(100), Some(100), Some(100)], &[]);
        assert!(!check.ok);
        assert_eq!(check.mismatches, 2);
        assert!(
            check.detail.contains("account 0: expected 99, got 100"),
            "{}",
            check.detail
        );
        assert!(check.detail.contains("account 1: expected 101, got 100"));
        let missing = ledger.check(&[Some(99), None, Some(100)], &[7]);
        assert_eq!(missing.mismatches, 2, "{}", missing.detail);
        assert!(missing.detail.contains("account 1: expected 101, missing"));
        assert!(missing.detail.contains("account 7: not expected, present"));
    }

    #[test]
    fn an_unknown_transfer_may_have_applied_or_not_but_nothing_else() {
        let ledger = Ledger::new(4, 100);
        {
            let mut c = ledger.client();
            c.sent(1, t(0, 1));
            c.sent(2, t(2, 3));
            c.answered(1, true);
            // Request 2 is still in flight when the client ends: unknown.
        }
        assert_eq!(ledger.unknown_count(), 1);
        let applied = ledger.check(&[Some(99), Some(101), Some(99), Some(101)], &[]);
        assert!(applied.ok, "{applied:?}");
        assert_eq!(applied.unknown_applied, Some(1));
        let not_applied = ledger.check(&[Some(99), Some(101), Some(100), Some(100)], &[]);
        assert!(not_applied.ok, "{not_applied:?}");
        assert_eq!(not_applied.unknown_applied, Some(0));
        // Half of it applied: no subset explains that.
        let half = ledger.check(&[Some(99), Some(101), Some(99), Some(100)], &[]);
        assert!(!half.ok, "{half:?}");
        // The unknown transfer does not excuse an account it never touched.
        let elsewhere = ledger.check(&[Some(98), Some(102), Some(100), Some(100)], &[]);
        assert!(!elsewhere.ok, "{elsewhere:?}");
    }

    #[test]
    fn many_unknown_transfers_are_checked_within_their_reach() {
        let unknown: Vec<Transfer> = (0..UNKNOWN_EXACT_MAX as u32 + 5).map(|_| t(0, 1)).collect();
        let expected = vec![100, 100, 100];
        let within = check_balances(&expected, &[Some(90), Some(110), Some(100)], &[], &unknown);
        assert!(within.ok && within.method == "bounded", "{within:?}");
        let beyond = check_balances(&expected, &[Some(70), Some(130), Some(100)], &[], &unknown);
        assert!(!beyond.ok && beyond.mismatches == 2, "{beyond:?}");
    }

    #[test]
    fn a_check_while_a_client_runs_fails() {
        let ledger = Ledger::new(2, 100);
        let c = ledger.client();
        let check = ledger.check(&[Some(100), Some(100)], &[]);
        assert!(
            !check.ok && check.detail.contains("still running"),
            "{check:?}"
        );
        drop(c);
        assert!(ledger.check(&[Some(100), Some(100)], &[]).ok);
    }
}
