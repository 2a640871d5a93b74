//! The owner a plan gives a Config file (`owner: USER:GROUP`), as the node's ids. Names are
//! looked up in the node's user and group databases (NSS, as `chown` would); a number is
//! taken as it is.

use nix::unistd::{Group, User};
use serde::{Deserialize, Serialize};

/// A file's owner, as the node's ids.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    /// The owning user.
    pub uid: u32,
    /// The owning group.
    pub gid: u32,
}

/// A file's permission bits and owner, as the node's ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileAttributes {
    /// Permission bits (`0o640`); never setuid, setgid or sticky.
    pub mode: u32,
    /// The owning user's id.
    pub uid: u32,
    /// The owning group's id.
    pub gid: u32,
}

impl FileAttributes {
    /// The owner alone.
    pub fn owner(self) -> Owner {
        Owner {
            uid: self.uid,
            gid: self.gid,
        }
    }

    /// Whether the file belongs to root:root, which the agent's own files do already.
    pub fn owned_by_root(self) -> bool {
        self.uid == 0 && self.gid == 0
    }
}

/// `user` and `group` as ids, or what is wrong, naming the one the node does not know.
pub fn resolve(user: &str, group: &str) -> Result<(u32, u32), String> {
    let uid = id_of("user", user, |n| {
        User::from_name(n).map(|u| u.map(|u| u.uid.as_raw()))
    })?;
    let gid = id_of("group", group, |n| {
        Group::from_name(n).map(|g| g.map(|g| g.gid.as_raw()))
    })?;
    Ok((uid, gid))
}

/// `name` as a number, else as `lookup` finds it in the node's `kind` database.
fn id_of(
    kind: &str,
    name: &str,
    lookup: impl FnOnce(&str) -> nix::Result<Option<u32>>,
) -> Result<u32, String> {
    if let Ok(id) = name.parse() {
        return Ok(id);
    }
    match lookup(name) {
        Ok(Some(id)) => Ok(id),
        Ok(None) => Err(format!("{kind} {name:?} is not known on this node")),
        Err(e) => Err(format!("looking up {kind} {name:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_numbers_and_unknown_names() {
        assert_eq!(resolve("root", "root"), Ok((0, 0)));
        assert_eq!(resolve("0", "990"), Ok((0, 990)));
        assert_eq!(
            resolve("no-such-user-here", "root"),
            Err("user \"no-such-user-here\" is not known on this node".into())
        );
        assert_eq!(
            resolve("root", "no-such-group-here"),
            Err("group \"no-such-group-here\" is not known on this node".into())
        );
    }
}
