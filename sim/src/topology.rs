//! The server tree a scenario describes: servers named by their path from the root ("root",
//! "root.0", "root.0.2", ...), each with its parent, and the server each client talks to.

use crate::scenario::TopologySpec;

/// Index of a server in [`Topology::servers`] (the root is 0, parents come before children).
pub type ServerId = usize;
/// Index of a client, in the scenario file's order.
pub type ClientId = usize;

/// Who sends an RPC and awaits its answer: an end client, or an intermediate server asking its
/// parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Client(ClientId),
    Server(ServerId),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServerSpec {
    pub name: String,
    pub parent: Option<ServerId>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    pub servers: Vec<ServerSpec>,
    /// The servers clients talk to: the lowest level.
    pub leaves: Vec<ServerId>,
}

impl Topology {
    pub fn build(spec: &TopologySpec) -> Topology {
        let mut servers = vec![ServerSpec { name: "root".into(), parent: None }];
        let mut level = vec![0];
        for &fanout in &spec.levels {
            let mut next = Vec::with_capacity(level.len() * fanout);
            for &parent in &level {
                for i in 0..fanout {
                    next.push(servers.len());
                    servers.push(ServerSpec { name: format!("{}.{i}", servers[parent].name), parent: Some(parent) });
                }
            }
            level = next;
        }
        Topology { servers, leaves: level }
    }

    /// Levels of servers, the root counting as one.
    pub fn depth(&self) -> usize {
        let mut depth = 1;
        let mut server = self.leaves[0];
        while let Some(parent) = self.servers[server].parent {
            depth += 1;
            server = parent;
        }
        depth
    }

    /// The server client `client` talks to.
    pub fn server_of(&self, client: ClientId) -> ServerId {
        self.leaves[client % self.leaves.len()]
    }

    pub fn find(&self, name: &str) -> Option<ServerId> {
        self.servers.iter().position(|server| server.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_three_level_tree() {
        let tree = Topology::build(&TopologySpec { replicas: 1, levels: vec![3, 3] });
        assert_eq!(tree.servers.len(), 1 + 3 + 9);
        assert_eq!(tree.depth(), 3);
        assert_eq!(tree.servers[tree.leaves[4]].name, "root.1.1");
        assert_eq!(tree.server_of(10), tree.leaves[1]);
        assert_eq!(tree.find("root.2"), Some(3));
        let root = Topology::build(&TopologySpec::default());
        assert_eq!((root.depth(), root.server_of(7)), (1, 0));
    }
}
