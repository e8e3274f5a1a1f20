//! The handle of an instance a node keeps registered.

use tracing::warn;

use super::{Error, Node};

/// An instance this node keeps registered. Dropping it deregisters the instance (in the
/// background); [`RegistrationHandle::deregister`] does it and waits; [`RegistrationHandle::keep`]
/// leaves it registered.
#[derive(Debug)]
#[must_use = "dropping a RegistrationHandle deregisters the instance at once: keep the handle, or call .keep()"]
pub struct RegistrationHandle {
    pub(super) node: Node,
    pub(super) service: String,
    pub(super) instance: String,
    pub(super) armed: bool,
}

impl RegistrationHandle {
    /// The instance id.
    pub fn id(&self) -> &str {
        &self.instance
    }

    /// The service.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// Deregisters the instance and waits until it is off disk, applied by the node, and
    /// handed to the connection of every connected peer (within a push, a few
    /// milliseconds; at most a second for a peer that catches up by digest instead).
    ///
    /// # Errors
    /// As [`Node::deregister`].
    pub async fn deregister(mut self) -> Result<(), Error> {
        self.armed = false;
        self.node.deregister(&self.service, &self.instance).await
    }

    /// Keeps the instance registered after this handle is dropped (until
    /// [`Node::deregister`]); it is registered again at every start.
    pub fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for RegistrationHandle {
    fn drop(&mut self) {
        if !self.armed || self.node.is_stopped() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let node = self.node.clone();
            let (s, i) = (
                std::mem::take(&mut self.service),
                std::mem::take(&mut self.instance),
            );
            rt.spawn(async move {
                if let Err(e) = node.deregister(&s, &i).await {
                    warn!(
                        service = s,
                        instance = i,
                        "dropped registration not deregistered: {e}"
                    );
                }
            });
        }
    }
}
