//! The members' addresses as the node's membership gives them now, shared with the transport.
//! openraft hands the network a member's address once, when it starts replicating to it, and
//! keeps that replication stream when a membership change moves the member to another address
//! (`MetaNode::change_address`); the transport reads the current address here for every
//! message instead, so a moved member is reached at its new address at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::types::NodeId;

/// Member id to address, kept by the node from its membership (see `MetaNode::open`).
#[derive(Clone, Debug, Default)]
pub struct Addresses(Arc<RwLock<BTreeMap<NodeId, String>>>);

impl Addresses {
    /// Member `id`'s address if the membership names it at another than `addr` (it moved);
    /// copies nothing otherwise: the transport asks before every message.
    pub fn moved_from(&self, id: NodeId, addr: &str) -> Option<String> {
        self.0.read().get(&id).filter(|a| *a != addr).cloned()
    }

    /// Replaces every address with those of a membership.
    pub(crate) fn set(&self, members: BTreeMap<NodeId, String>) {
        *self.0.write() = members;
    }
}
