// Server functions for the transfer benchmark (SpacetimeDB keynote-2 workload).
// Run with: sluice serve --functions examples/bank.js
export function transfer(tx, { from, to, amount }) {
  if (from === to) throw new Error("same_account: cannot transfer to the same account");
  const a = tx.get("accounts", from);
  if (a === null) throw new Error(`missing_account: no account ${from}`);
  const b = tx.get("accounts", to);
  if (b === null) throw new Error(`missing_account: no account ${to}`);
  if (a.balance < amount) throw new Error(`insufficient_funds: account ${from} has ${a.balance}`);
  tx.patch("accounts", from, { balance: a.balance - amount });
  tx.patch("accounts", to, { balance: b.balance + amount });
  return null;
}

export function balance(tx, { id }) {
  const a = tx.get("accounts", id);
  return a === null ? null : a.balance;
}
