//! The replica on disk, entry by entry: one row per registration (keyed by
//! `service/provider`), one row per node's lease (keyed by node id), and the causal context
//! as one value of the meta table. A save writes the rows of the keys that changed and the
//! whole context, in the caller's transaction (with the counter floor), so a crash leaves
//! the replica of one save or of the next, never a mix: the context saved never names a dot
//! whose entry was not written with it (such a dot would read as removed).
//!
//! Format 1 kept the whole state in one value (`K_STATE`); [`migrate`] turns it into rows.

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};
use roster_registry::{codec, ChangedKeys, EntryLoader, RegKey, ReplicaId, State};

/// Registrations: `service/provider` → the encoded entry (every write it holds).
const REGS: TableDefinition<&str, &[u8]> = TableDefinition::new("regs");
/// Leases: node id → the encoded entry (every lease write of that node).
const LEASES: TableDefinition<u64, &[u8]> = TableDefinition::new("leases");
/// The causal context, in the meta table.
pub(super) const K_CONTEXT: &str = "context";
/// The whole state of format 1, in the meta table.
pub(super) const K_STATE: &str = "state";

/// Why the replica on disk could not be read or written.
#[derive(Debug)]
pub(super) enum Fail {
    /// The database failed.
    Io(String),
    /// What it holds is damaged.
    Corrupt(String),
}

fn io(e: impl std::fmt::Display) -> Fail {
    Fail::Io(e.to_string())
}

/// The rows one save writes, encoded before the transaction begins: `None` removes a row.
#[derive(Debug, Default)]
pub(super) struct Batch {
    regs: Vec<(String, Option<Vec<u8>>)>,
    leases: Vec<(u64, Option<Vec<u8>>)>,
    ctx: Vec<u8>,
}

impl Batch {
    /// The rows of the keys `changed` names, as `state` holds them, and its context.
    pub(super) fn changed(state: &State, changed: &ChangedKeys) -> Self {
        Self {
            regs: changed
                .regs
                .iter()
                .map(|k| (row_key(k), state.encode_reg_entry(k)))
                .collect(),
            leases: changed
                .leases
                .iter()
                .map(|n| (n.0, state.encode_lease_entry(*n)))
                .collect(),
            ctx: codec::encode_context(state.context()),
        }
    }

    /// Every row of `state` (a store that holds none yet), and its context.
    pub(super) fn whole(state: &State) -> Self {
        let changed = ChangedKeys {
            regs: state.reg_keys().cloned().collect(),
            leases: state.lease_nodes().collect(),
        };
        Self::changed(state, &changed)
    }

    /// How many rows it writes or removes.
    pub(super) fn len(&self) -> usize {
        self.regs.len() + self.leases.len()
    }
}

fn row_key(k: &RegKey) -> String {
    super::key(k.service.as_str(), k.provider.as_str())
}

/// Writes `batch` in `tx`; the context goes into `meta`. A table with no row to write is
/// not opened (under churn most saves change no lease, and opening a table costs redb
/// a few dozen allocations to read and write back its definition).
pub(super) fn write(tx: &WriteTransaction, meta: &mut Table<&str, &[u8]>, batch: &Batch) -> Result<(), Fail> {
    if !batch.regs.is_empty() {
        write_regs(tx, &batch.regs)?;
    }
    if !batch.leases.is_empty() {
        write_leases(tx, &batch.leases)?;
    }
    meta.insert(K_CONTEXT, batch.ctx.as_slice()).map_err(io)?;
    Ok(())
}

fn write_regs(tx: &WriteTransaction, rows: &[(String, Option<Vec<u8>>)]) -> Result<(), Fail> {
    let mut regs = tx.open_table(REGS).map_err(io)?;
    for (k, v) in rows {
        match v {
            Some(v) => regs.insert(k.as_str(), v.as_slice()).map(drop),
            None => regs.remove(k.as_str()).map(drop),
        }
        .map_err(io)?;
    }
    Ok(())
}

fn write_leases(tx: &WriteTransaction, rows: &[(u64, Option<Vec<u8>>)]) -> Result<(), Fail> {
    let mut leases = tx.open_table(LEASES).map_err(io)?;
    for (n, v) in rows {
        match v {
            Some(v) => leases.insert(n, v.as_slice()).map(drop),
            None => leases.remove(n).map(drop),
        }
        .map_err(io)?;
    }
    Ok(())
}

/// The replica's state as saved: every row and the context, every invariant checked.
pub(super) fn load(tx: &WriteTransaction, meta: &Table<&str, &[u8]>) -> Result<State, Fail> {
    let mut loader = EntryLoader::new();
    let regs = tx.open_table(REGS).map_err(io)?;
    for row in regs.iter().map_err(io)? {
        let (k, v) = row.map_err(io)?;
        let key = super::split_key(k.value())
            .ok_or_else(|| Fail::Corrupt(format!("the registration key {:?}", k.value())))?;
        loader
            .add_reg(key, v.value())
            .map_err(|e| Fail::Corrupt(format!("the registration {}: {e}", k.value())))?;
    }
    let leases = tx.open_table(LEASES).map_err(io)?;
    for row in leases.iter().map_err(io)? {
        let (n, v) = row.map_err(io)?;
        let node = ReplicaId(n.value());
        loader
            .add_lease(node, v.value())
            .map_err(|e| Fail::Corrupt(format!("the lease of {node}: {e}")))?;
    }
    let ctx = meta.get(K_CONTEXT).map_err(io)?;
    loader
        .finish(ctx.as_ref().map(|v| v.value()))
        .map_err(|e| Fail::Corrupt(format!("the replica: {e}")))
}

/// Forgets the replica: every row and the context.
pub(super) fn clear(tx: &WriteTransaction, meta: &mut Table<&str, &[u8]>) -> Result<(), Fail> {
    tx.delete_table(REGS).map_err(io)?;
    tx.delete_table(LEASES).map_err(io)?;
    meta.remove(K_CONTEXT).map_err(io)?;
    meta.remove(K_STATE).map_err(io)?;
    Ok(())
}

/// Turns the whole state of format 1 (if any) into rows, in `tx`, and removes it. Returns
/// how many rows it wrote.
pub(super) fn migrate(tx: &WriteTransaction, meta: &mut Table<&str, &[u8]>) -> Result<usize, Fail> {
    let state = match meta.get(K_STATE).map_err(io)? {
        None => return Ok(0),
        Some(v) => codec::decode_state(v.value()).map_err(|e| Fail::Corrupt(format!("the replica: {e}")))?,
    };
    let batch = Batch::whole(&state);
    write(tx, meta, &batch)?;
    meta.remove(K_STATE).map_err(io)?;
    Ok(batch.len())
}
