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
//! With unknowns, the differences must be the effect of one subset of them: searched
//! exhaustively up to [`UNKNOWN_EXACT_MAX`] of them; beyond that, when they all move the
//! same amount (the bench's transfers always do), as a maximum-flow problem, which is exact
//! there (an integral flow takes each transfer wholly or not at all). Only for many unknown
//! transfers of different amounts is the check bounded: each account's difference must lie
//! within what the unknowns touching it could have done.

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
            in_flight: Vec::new(),
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
    /// The transfer in flight in each request slot (a client's request ids are its slots,
    /// `0..pipeline`): indexed, not a map, as every call passes through it twice.
    in_flight: Vec<Option<Transfer>>,
}

impl ClientGuard {
    pub fn sent(&mut self, id: usize, t: Transfer) {
        if id >= self.in_flight.len() {
            self.in_flight.resize(id + 1, None);
        }
        let before = self.in_flight[id].replace(t);
        debug_assert!(before.is_none(), "slot {id} sent twice without a reply");
    }

    fn take(&mut self, id: usize) -> Option<Transfer> {
        self.in_flight.get_mut(id).and_then(Option::take)
    }

    /// The reply for `id` came: acknowledged (`true`) or refused (`false`).
    pub fn answered(&mut self, id: usize, acked: bool) {
        if let Some(t) = self.take(id) {
            if acked {
                self.ledger.acked(t);
            }
        }
    }

    /// The reply for `id` came but does not say whether the transfer applied.
    pub fn unknown(&mut self, id: usize) {
        if let Some(t) = self.take(id) {
            self.ledger.unknown(t);
        }
    }
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        for t in std::mem::take(&mut self.in_flight).into_iter().flatten() {
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
    /// Exact resolution only: how many unknown transfers applied in the subset found to
    /// explain the balances (one such subset; another may explain them too).
    pub unknown_applied: Option<u64>,
    /// `exact`: every balance must be equal, or explained by one subset of the unknown
    /// transfers (found by enumeration, or by a maximum flow); `bounded`: many unknowns of
    /// different amounts, each account within their reach.
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
        method: if unknown.len() <= UNKNOWN_EXACT_MAX || same_amount(unknown) {
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
    } else if check.method == "exact" {
        let explained = if unknown.len() <= UNKNOWN_EXACT_MAX {
            explain_exactly(&diff, unknown)
        } else {
            explain_by_flow(&diff, unknown)
        };
        match explained {
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
                (n, Some(a)) => format!(
                    "; explained by {a} of the {n} transfer(s) of unknown outcome having applied"
                ),
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

fn same_amount(unknown: &[Transfer]) -> bool {
    unknown.windows(2).all(|w| w[0].amount == w[1].amount)
}

/// With every unknown transfer moving the same amount: the size of one subset of them that
/// accounts for exactly `diff` on every account they touch, if there is one. As a flow:
/// each transfer is an arc `from → to` of capacity 1 (one amount), each account that lost
/// `k` amounts is fed `k` by the source and each that gained `k` gives `k` to the sink; a
/// subset exists iff the maximum flow saturates the source, and an integral flow uses each
/// transfer's arc wholly or not at all.
fn explain_by_flow(diff: &BTreeMap<u32, i64>, unknown: &[Transfer]) -> Option<u64> {
    let amount = unknown.first()?.amount;
    assert!(same_amount(unknown), "one amount for the flow");
    if amount <= 0 {
        return None;
    }
    let mut ids: Vec<u32> = unknown.iter().flat_map(|t| [t.from, t.to]).collect();
    ids.sort_unstable();
    ids.dedup();
    let index = |id: u32| ids.binary_search(&id).expect("collected above");
    let (source, sink) = (ids.len(), ids.len() + 1);
    let mut net = Network::new(ids.len() + 2);
    let mut arcs = Vec::with_capacity(unknown.len());
    for t in unknown {
        arcs.push(net.arc(index(t.from), index(t.to), 1));
    }
    let (mut supply, mut demand) = (0i64, 0i64);
    for (i, id) in ids.iter().enumerate() {
        let d = diff.get(id).copied().unwrap_or(0);
        if d % amount != 0 {
            return None;
        }
        let units = d / amount;
        if units < 0 {
            net.arc(source, i, -units);
            supply -= units;
        } else if units > 0 {
            net.arc(i, sink, units);
            demand += units;
        }
    }
    if supply != demand || net.max_flow(source, sink) != supply {
        return None;
    }
    Some(arcs.iter().filter(|&&a| net.used(a)).count() as u64)
}

/// A small flow network (residual arcs in pairs), Edmonds–Karp.
struct Network {
    /// Arc `a` goes to `head[a]` with residual capacity `cap[a]`; `a ^ 1` is its reverse.
    head: Vec<usize>,
    cap: Vec<i64>,
    out: Vec<Vec<usize>>,
}

impl Network {
    fn new(nodes: usize) -> Network {
        Network {
            head: Vec::new(),
            cap: Vec::new(),
            out: vec![Vec::new(); nodes],
        }
    }

    /// Adds an arc and returns its id.
    fn arc(&mut self, from: usize, to: usize, cap: i64) -> usize {
        let a = self.head.len();
        self.head.extend([to, from]);
        self.cap.extend([cap, 0]);
        self.out[from].push(a);
        self.out[to].push(a + 1);
        a
    }

    /// Whether arc `a` carries flow (its reverse has residual capacity).
    fn used(&self, a: usize) -> bool {
        self.cap[a ^ 1] > 0
    }

    fn max_flow(&mut self, source: usize, sink: usize) -> i64 {
        let mut flow = 0;
        loop {
            // Breadth-first search for a shortest augmenting path.
            let mut via: Vec<Option<usize>> = vec![None; self.out.len()];
            let mut queue = std::collections::VecDeque::from([source]);
            while let Some(v) = queue.pop_front() {
                for &a in &self.out[v] {
                    let w = self.head[a];
                    if self.cap[a] > 0 && w != source && via[w].is_none() {
                        via[w] = Some(a);
                        queue.push_back(w);
                    }
                }
            }
            if via[sink].is_none() {
                return flow;
            }
            let mut push = i64::MAX;
            let mut v = sink;
            while let Some(a) = via[v] {
                push = push.min(self.cap[a]);
                v = self.head[a ^ 1];
            }
            let mut v = sink;
            while let Some(a) = via[v] {
                self.cap[a] -= push;
                self.cap[a ^ 1] += push;
                v = self.head[a ^ 1];
            }
            flow += push;
        }
    }
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
    fn many_unknown_transfers_of_one_amount_are_resolved_exactly_by_a_flow() {
        // 40 unknown transfers around a ring of 8 accounts and across it: more than the
        // enumeration takes.
        let unknown: Vec<Transfer> = (0..40u32)
            .map(|i| t(i % 8, (i * 3 + 1) % 8))
            .filter(|x| x.from != x.to)
            .collect();
        assert!(unknown.len() > UNKNOWN_EXACT_MAX);
        let expected = vec![100i64; 9];
        // Apply a known subset: every third transfer.
        let mut got: Vec<i64> = expected.clone();
        for x in unknown.iter().step_by(3) {
            got[x.from as usize] -= 1;
            got[x.to as usize] += 1;
        }
        let got: Vec<Option<i64>> = got.into_iter().map(Some).collect();
        let check = check_balances(&expected, &got, &[], &unknown);
        assert!(check.ok && check.method == "exact", "{check:?}");
        assert!(check.unknown_applied.is_some());
        // One account off by one more than any subset could make it: refused.
        let mut off = got.clone();
        off[0] = off[0].map(|b| b - 40);
        off[1] = off[1].map(|b| b + 40);
        let check = check_balances(&expected, &off, &[], &unknown);
        assert!(!check.ok, "{check:?}");
        // Money appearing from nowhere (the sum moved) is never explained.
        let mut created = got.clone();
        created[2] = created[2].map(|b| b + 1);
        assert!(!check_balances(&expected, &created, &[], &unknown).ok);
        // The untouched account 8 must be exact.
        let mut elsewhere = got.clone();
        elsewhere[8] = Some(101);
        elsewhere[0] = elsewhere[0].map(|b| b - 1);
        let check = check_balances(&expected, &elsewhere, &[], &unknown);
        assert!(!check.ok && check.detail.contains("account 8"), "{check:?}");
    }

    #[test]
    fn the_flow_agrees_with_enumeration_on_small_random_cases() {
        // Seeded: on failure, the seed and case are in the message.
        let mut state = 0x5eed_u64;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        for case in 0..300 {
            let n = 1 + next(10) as usize;
            let unknown: Vec<Transfer> = (0..n)
                .map(|_| t(next(5) as u32, next(5) as u32))
                .filter(|x| x.from != x.to)
                .collect();
            let mut diff = BTreeMap::new();
            for id in 0..5u32 {
                let d = next(5) as i64 - 2;
                if d != 0 {
                    diff.insert(id, d);
                }
            }
            if unknown.is_empty() {
                continue;
            }
            let by_enumeration = explain_exactly(&diff, &unknown).is_some();
            let by_flow = explain_by_flow(&diff, &unknown).is_some();
            assert_eq!(
                by_enumeration, by_flow,
                "seed 0x5eed, case {case}: {unknown:?} {diff:?}"
            );
        }
    }

    #[test]
    fn many_unknown_transfers_of_different_amounts_are_checked_within_their_reach() {
        let unknown: Vec<Transfer> = (0..UNKNOWN_EXACT_MAX as u32 + 5)
            .map(|i| Transfer {
                from: 0,
                to: 1,
                amount: 1 + i64::from(i % 2),
            })
            .collect();
        let expected = vec![100, 100, 100];
        let within = check_balances(&expected, &[Some(90), Some(110), Some(100)], &[], &unknown);
        assert!(within.ok && within.method == "bounded", "{within:?}");
        // 13 × 1 + 12 × 2 = 37 at most can have moved.
        let beyond = check_balances(&expected, &[Some(60), Some(140), Some(100)], &[], &unknown);
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
