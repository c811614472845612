//! The live sessions the editor has opened through the bridge.
//!
//! The bridge must be able to put every live session back on a freshly
//! started backend, and later issues read the union of session roots from
//! here to decide what the sandbox makes writable. So each entry keeps what
//! restoring needs: the roots, the MCP servers exactly as the editor sent
//! them, and the mode, model and config options the editor (or agent) last
//! set.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// One live session.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub id: String,
    pub cwd: PathBuf,
    pub additional_directories: Vec<PathBuf>,
    /// `mcpServers` as the editor wrote it (JSON text), replayed verbatim.
    pub mcp_servers: String,
    pub mode: Option<String>,
    pub model: Option<String>,
    /// configId -> value, in the order they were first set.
    pub config_options: Vec<(String, serde_json::Value)>,
}

impl Session {
    pub fn new(
        id: String,
        cwd: PathBuf,
        additional_directories: Vec<PathBuf>,
        mcp_servers: String,
    ) -> Self {
        Session {
            id,
            cwd,
            additional_directories,
            mcp_servers,
            mode: None,
            model: None,
            config_options: Vec::new(),
        }
    }

    /// The workspace roots of this session: `cwd` plus `additionalDirectories`.
    pub fn roots(&self) -> impl Iterator<Item = &PathBuf> {
        std::iter::once(&self.cwd).chain(self.additional_directories.iter())
    }

    pub fn set_config_option(&mut self, config_id: String, value: serde_json::Value) {
        match self
            .config_options
            .iter_mut()
            .find(|(id, _)| *id == config_id)
        {
            Some(slot) => slot.1 = value,
            None => self.config_options.push((config_id, value)),
        }
    }
}

/// The session table. Sessions that could not be carried over to a new
/// backend are kept apart with the reason, so their next request can say so.
#[derive(Debug, Default)]
pub struct SessionTable {
    live: BTreeMap<String, Session>,
    lost: BTreeMap<String, String>,
}

impl SessionTable {
    /// Adds or replaces a session (new, load, resume, fork all end here).
    pub fn insert(&mut self, session: Session) {
        self.lost.remove(&session.id);
        self.live.insert(session.id.clone(), session);
    }

    /// Forgets a session (close, delete).
    pub fn remove(&mut self, id: &str) -> Option<Session> {
        self.lost.remove(id);
        self.live.remove(id)
    }

    pub fn get(&self, id: &str) -> Option<&Session> {
        self.live.get(id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Session> {
        self.live.get_mut(id)
    }

    pub fn live(&self) -> impl Iterator<Item = &Session> {
        self.live.values()
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Moves a live session to the lost set with the reason it was lost.
    pub fn mark_lost(&mut self, id: &str, reason: String) {
        self.live.remove(id);
        self.lost.insert(id.to_owned(), reason);
    }

    /// Whether any session was lost (so a frame's session is worth reading).
    pub fn any_lost(&self) -> bool {
        !self.lost.is_empty()
    }

    /// Why a session was lost, if it was.
    pub fn lost_reason(&self, id: &str) -> Option<&str> {
        self.lost.get(id).map(String::as_str)
    }

    pub fn forget_lost(&mut self, id: &str) {
        self.lost.remove(id);
    }

    /// The union of all live sessions' roots, sorted and deduplicated.
    pub fn roots(&self) -> Vec<PathBuf> {
        let mut roots: Vec<PathBuf> = self
            .live
            .values()
            .flat_map(|s| s.roots().cloned())
            .collect();
        roots.sort();
        roots.dedup();
        roots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(id: &str, cwd: &str, extra: &[&str]) -> Session {
        Session::new(
            id.into(),
            cwd.into(),
            extra.iter().map(PathBuf::from).collect(),
            "[]".to_owned(),
        )
    }

    #[test]
    fn roots_are_the_union_of_live_sessions() {
        let mut t = SessionTable::default();
        t.insert(s("a", "/w/one", &["/w/shared"]));
        t.insert(s("b", "/w/two", &["/w/shared"]));
        assert_eq!(
            t.roots(),
            vec![PathBuf::from("/w/one"), "/w/shared".into(), "/w/two".into()]
        );
        t.remove("a");
        assert_eq!(t.roots(), vec![PathBuf::from("/w/shared"), "/w/two".into()]);
    }

    #[test]
    fn lost_sessions_leave_the_roots_and_come_back_on_insert() {
        let mut t = SessionTable::default();
        t.insert(s("a", "/w/one", &[]));
        t.mark_lost("a", "refused".into());
        assert!(t.roots().is_empty());
        assert_eq!(t.lost_reason("a"), Some("refused"));
        t.insert(s("a", "/w/one", &[]));
        assert_eq!(t.lost_reason("a"), None);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn config_options_keep_first_order_and_last_value() {
        let mut x = s("a", "/w", &[]);
        x.set_config_option("model".into(), "m1".into());
        x.set_config_option("effort".into(), "high".into());
        x.set_config_option("model".into(), "m2".into());
        assert_eq!(
            x.config_options,
            vec![
                ("model".into(), "m2".into()),
                ("effort".into(), "high".into())
            ]
        );
    }
}
