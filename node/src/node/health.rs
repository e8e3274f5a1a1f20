//! The status of the instances a node owns: maintenance set by an operator, and the status
//! its checks decide. A change of status is written like a registration (one replicated
//! write, saved on disk), and only a change is: what does not change costs nothing.

use roster_registry::{is_printable, Status, MAX_NOTE_LEN};

use super::held::key_of;
use super::{Error, Node};
use crate::store::OwnedRecord;

impl Node {
    /// Takes an instance this node owns out of reads without deregistering it (a drain
    /// before a deploy), with `reason` shown beside it; `None` puts it back in service.
    /// `instance` is `(service, id)`, or `None` for every instance this node owns. Kept
    /// across restarts. Returns the instances whose status changed, as `service/id`.
    ///
    /// # Errors
    /// [`Error::NotFound`] when this node owns no such instance; [`Error::Invalid`] for a
    /// reason over 256 bytes or with control characters; [`Error::Store`];
    /// [`Error::Stopped`]. Nothing changed.
    pub async fn maintenance(
        &self,
        instance: Option<(&str, &str)>,
        reason: Option<&str>,
    ) -> Result<Vec<String>, Error> {
        if let Some(r) = reason {
            check_reason(r)?;
        }
        let targets: Vec<OwnedRecord> = {
            let owned = self.inner.owned.lock().await;
            let ttl = self.inner.lease_ttl_ms;
            match instance {
                Some((service, id)) => {
                    let held = key_of(service, id).and_then(|k| owned.get(&k)).ok_or_else(|| {
                        Error::NotFound(format!("this node owns no instance {id:?} of {service:?}"))
                    })?;
                    vec![held.record(ttl)]
                }
                None => owned.values().map(|h| h.record(ttl)).collect(),
            }
        };
        // Queued together, so the group commit writes them a few dozen to a transaction
        // instead of one commit (and one fsync) each.
        let mut changed = Vec::new();
        let mut answers = Vec::new();
        for mut rec in targets {
            let before = rec.effective_status();
            rec.maintenance = reason.map(str::to_string);
            if rec.effective_status() != before {
                changed.push(rec.key());
                answers.push(self.queue(rec, None));
            }
        }
        for answer in answers {
            answer.await.unwrap_or(Err(Error::Stopped))?;
        }
        Ok(changed)
    }

    /// Writes the status the checks of an owned instance decided, when it differs from
    /// what is saved (saved under maintenance too, which hides it, so it is right when
    /// maintenance ends).
    pub(super) async fn set_checked_status(&self, key: &str, status: Status) -> Result<(), Error> {
        let rec = {
            let owned = self.inner.owned.lock().await;
            match crate::store::split_key(key).and_then(|k| owned.get(&k)) {
                Some(held) if *held.status() != status => held.record(self.inner.lease_ttl_ms),
                _ => return Ok(()),
            }
        };
        self.rewrite(OwnedRecord { status, ..rec }).await
    }
}

fn check_reason(r: &str) -> Result<(), Error> {
    if r.len() > MAX_NOTE_LEN || !r.chars().all(is_printable) {
        return Err(Error::Invalid(format!(
            "a maintenance reason must be at most {MAX_NOTE_LEN} bytes of printable characters on one line"
        )));
    }
    Ok(())
}
