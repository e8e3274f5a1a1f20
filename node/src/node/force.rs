//! What an operator may do over the owner checks: force-leave (a member whose node is gone
//! for good, written dead for every replica now rather than when its lease ends), and the
//! removal of an instance whatever node owns it.

use roster_registry::{ProviderId, RegKey, ReplicaId, ServiceName};
use roster_transport::proto::{self, ForcedDeath};

use super::{now_ms, Error, Node};

impl Node {
    /// Writes the live member `node` (its name, or its 16-hex-digit id) dead for every
    /// replica: its registrations leave every read at once, here and wherever the delta
    /// reaches, as when the failure detector writes a lost node dead. A node that is in
    /// fact alive renews its lease when it hears of it and is back. Returns its id.
    ///
    /// # Errors
    /// [`Error::NotFound`] when no live member has that name or id; [`Error::Invalid`] when
    /// two have that name; [`Error::Answers`] when it is this node or one connected to it;
    /// [`Error::Stopped`]. Nothing changed in each case.
    pub async fn force_leave(&self, node: &str) -> Result<String, Error> {
        let id = self.live_member(node)?;
        match self.inner.handle.force_dead(id).await? {
            ForcedDeath::Written => {
                tracing::warn!(node = %id, named = node, "force-leave: written dead by an operator");
                Ok(id.to_string())
            }
            ForcedDeath::Answers => Err(Error::Answers(format!(
                "node {node} answers (it is this agent or connected to it); stop it, or run `roster leave` against it"
            ))),
            ForcedDeath::Unknown => Err(not_a_member(node)),
        }
    }

    /// Removes an instance whatever node owns it: the operator's exception to the owner
    /// check of [`Node::deregister`], for an instance stranded by its owner. Logged (a
    /// warning) and counted (`operator_removals`). An owner that is alive writes it again;
    /// deregister it there instead. One this node owns is deregistered as usual.
    ///
    /// # Errors
    /// [`Error::Input`] for a bad name; [`Error::NotFound`] when no node holds it here;
    /// [`Error::Store`]; [`Error::Stopped`].
    pub async fn remove_as_operator(&self, service: &str, instance: &str) -> Result<(), Error> {
        let s = ServiceName::new(service)?;
        let p = ProviderId::new(instance)?;
        if self.inner.owned.lock().await.contains_key(&RegKey {
            service: s.clone(),
            provider: p.clone(),
        }) {
            return self.deregister(service, instance).await;
        }
        let owner = self.owner_elsewhere(&s, &p);
        if !self.inner.handle.remove_as_operator(s, p).await? {
            return Err(Error::NotFound(format!(
                "no node holds an instance {instance:?} of {service:?} here; `roster get {service} --all` lists them"
            )));
        }
        tracing::warn!(
            service,
            instance,
            owner = owner.as_deref().unwrap_or("a node that is not a live member"),
            "an operator removed an instance of another node"
        );
        self.inner.handle.pushed().await;
        Ok(())
    }

    /// The id of the live member named or numbered `node`.
    fn live_member(&self, node: &str) -> Result<ReplicaId, Error> {
        let replica = self.inner.handle.replica();
        let found: Vec<ReplicaId> = proto::live_members(&replica, now_ms())
            .into_iter()
            .filter(|m| m.name == node || m.id.to_string() == node)
            .map(|m| m.id)
            .collect();
        match found.as_slice() {
            [] => Err(not_a_member(node)),
            [id] => Ok(*id),
            _ => Err(Error::Invalid(format!(
                "{} live members are named {node}; give the id of the one to remove (`roster members` shows them)",
                found.len()
            ))),
        }
    }
}

fn not_a_member(node: &str) -> Error {
    Error::NotFound(format!(
        "no live member is named {node} (or has that id); `roster members` lists them"
    ))
}
