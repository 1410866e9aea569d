//! The triggers already admitted: each ScaledObject's metadata as last parsed and checked
//! against the source policy, kept with the table it was parsed from.
//!
//! KEDA sends a trigger's whole metadata table on every `GetMetrics` and `IsActive`, the same
//! table poll after poll. Parsing it is pure and the source policy is fixed for the life of the
//! process, so an equal table admits to the same trigger: the evaluation reuses it and compares
//! tables instead of parsing again (a parse looks every key up, reads the numbers and durations
//! and parses the Prometheus URL against the allow-list). A table that differs in anything is
//! parsed and checked again; a table that fails is never kept, so its error is reported on
//! every poll. A ScaledObject with several nightshift triggers sends one table per trigger
//! under the same name, so up to [`TABLES_PER_OBJECT`] tables are kept per ScaledObject, the
//! least recently used giving way. Entries are dropped with the ScaledObject's other state when
//! it is no longer evaluated.
//!
//! Only evaluations keep tables: a ScaledObject that is only asked for its metric spec is never
//! evaluated, so nothing would forget it. `GetMetricSpec` and a stream's start look a table up
//! ([`Admitted::get`]) and parse it when it is not kept, keeping nothing.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
};

use super::{
    Error,
    metadata::{Table, TriggerConfig},
};

/// Tables kept per ScaledObject: one per trigger of a ScaledObject with several nightshift
/// triggers (a handful at most in practice), and the bound on what an edited ScaledObject leaves
/// behind until it is forgotten.
pub const TABLES_PER_OBJECT: usize = 4;

/// A trigger as admitted, with the metadata table it came from.
struct Entry {
    raw: FlatTable,
    config: Arc<TriggerConfig>,
}

/// A metadata table kept in one allocation: each key and value in the table's order, each after
/// its length. Compared with the table KEDA sends on every poll, it is read straight through
/// from one place, where a kept `Table` spread its keys and values over a string each and its
/// tree's nodes, so the comparison touched a dozen places in memory the server's other work had
/// just pushed out of the caches.
struct FlatTable {
    bytes: Box<[u8]>,
    entries: usize,
}

/// Bytes of the length before each key and value.
const LENGTH_BYTES: usize = std::mem::size_of::<usize>();

impl FlatTable {
    fn new(table: &Table) -> Self {
        let size = table
            .iter()
            .map(|(k, v)| 2 * LENGTH_BYTES + k.len() + v.len())
            .sum();
        let mut bytes = Vec::with_capacity(size);
        for text in table.iter().flat_map(|(k, v)| [k, v]) {
            bytes.extend_from_slice(&text.len().to_ne_bytes());
            bytes.extend_from_slice(text.as_bytes());
        }
        Self {
            bytes: bytes.into_boxed_slice(),
            entries: table.len(),
        }
    }

    /// Whether `table` holds exactly the keys and values this was made from (both are in key
    /// order, so they compare in one pass).
    fn matches(&self, table: &Table) -> bool {
        if table.len() != self.entries {
            return false;
        }
        let mut rest = &self.bytes[..];
        for text in table.iter().flat_map(|(k, v)| [k, v]) {
            let Some((length, tail)) = rest.split_first_chunk::<LENGTH_BYTES>() else {
                return false;
            };
            let Some((kept, tail)) = tail.split_at_checked(usize::from_ne_bytes(*length)) else {
                return false;
            };
            if kept != text.as_bytes() {
                return false;
            }
            rest = tail;
        }
        rest.is_empty()
    }
}

/// The admitted triggers, by namespace and ScaledObject name.
#[derive(Default)]
pub struct Admitted {
    /// By namespace, then name: lookups borrow the request's strings instead of building a key.
    /// Each list is most recently used first.
    entries: Mutex<HashMap<String, HashMap<String, Vec<Entry>>>>,
}

impl Admitted {
    /// The trigger of ScaledObject `namespace/name` for metadata `raw`: the one kept if `raw` is
    /// a table it was admitted from, else `admit(raw)`, kept when it succeeds. The lock is not
    /// held while `admit` runs.
    pub fn get_or_admit(
        &self,
        namespace: &str,
        name: &str,
        raw: &Table,
        admit: impl FnOnce() -> Result<TriggerConfig, Error>,
    ) -> Result<Arc<TriggerConfig>, Error> {
        if let Some(config) = self.get(namespace, name, raw) {
            return Ok(config);
        }
        let config = Arc::new(admit()?);
        let mut entries = self.lock();
        let tables = entries
            .entry(namespace.to_string())
            .or_default()
            .entry(name.to_string())
            .or_default();
        tables.retain(|e| !e.raw.matches(raw));
        tables.insert(
            0,
            Entry {
                raw: FlatTable::new(raw),
                config: config.clone(),
            },
        );
        tables.truncate(TABLES_PER_OBJECT);
        Ok(config)
    }

    /// The trigger kept for ScaledObject `namespace/name` if `raw` is a table it was admitted
    /// from (which then becomes its most recently used); `None` otherwise, keeping nothing.
    pub fn get(&self, namespace: &str, name: &str, raw: &Table) -> Option<Arc<TriggerConfig>> {
        let mut entries = self.lock();
        let tables = entries.get_mut(namespace)?.get_mut(name)?;
        let i = tables.iter().position(|e| e.raw.matches(raw))?;
        tables[..=i].rotate_right(1);
        Some(tables[0].config.clone())
    }

    /// Drops what was kept for ScaledObject `namespace/name`.
    pub fn forget(&self, namespace: &str, name: &str) {
        let mut entries = self.lock();
        if let Some(names) = entries.get_mut(namespace) {
            names.remove(name);
            if names.is_empty() {
                entries.remove(namespace);
            }
        }
    }

    /// How many tables are kept.
    pub fn len(&self) -> usize {
        self.lock()
            .values()
            .flat_map(HashMap::values)
            .map(Vec::len)
            .sum()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, HashMap<String, Vec<Entry>>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::scaler::metadata;

    fn table(model: &str) -> Table {
        [
            ("serverAddress", "http://prometheus.monitoring:9090"),
            ("model", model),
            ("waitingTarget", "2"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// `admit` as the scaler runs it, counting its calls.
    fn admit<'a>(
        raw: &'a Table,
        calls: &'a Cell<usize>,
    ) -> impl FnOnce() -> Result<TriggerConfig, Error> + 'a {
        move || {
            calls.set(calls.get() + 1);
            Ok(metadata::parse(raw, "inference")?)
        }
    }

    proptest::proptest! {
        /// A kept table matches exactly the tables equal to the one it was made from.
        #[test]
        fn a_flat_table_matches_exactly_the_equal_tables(
            kept in proptest::collection::btree_map("[a-c]{0,3}", "[a-c=,]{0,4}", 0..4),
            sent in proptest::collection::btree_map("[a-c]{0,3}", "[a-c=,]{0,4}", 0..4),
        ) {
            let flat = FlatTable::new(&kept);
            proptest::prop_assert!(flat.matches(&kept));
            proptest::prop_assert_eq!(flat.matches(&sent), kept == sent);
        }
    }

    #[test]
    fn a_flat_table_tells_where_one_text_ends() {
        let pairs = |pairs: &[(&str, &str)]| -> Table {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let flat = FlatTable::new(&pairs(&[("a", "bc"), ("d", "")]));
        assert!(flat.matches(&pairs(&[("a", "bc"), ("d", "")])));
        // The same bytes cut elsewhere, or one entry more or less, are another table.
        assert!(!flat.matches(&pairs(&[("a", "b"), ("cd", "")])));
        assert!(!flat.matches(&pairs(&[("a", "bcd")])));
        assert!(!flat.matches(&pairs(&[("a", "bc"), ("d", ""), ("e", "")])));
        assert!(FlatTable::new(&Table::new()).matches(&Table::new()));
    }

    #[test]
    fn an_equal_table_is_parsed_once() {
        let admitted = Admitted::default();
        let calls = Cell::new(0);
        let raw = table("llama");
        let first = admitted
            .get_or_admit("inference", "chat", &raw, admit(&raw, &calls))
            .expect("admitted");
        let again = table("llama");
        let second = admitted
            .get_or_admit("inference", "chat", &again, admit(&again, &calls))
            .expect("admitted");
        assert_eq!(calls.get(), 1);
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(admitted.len(), 1);
    }

    #[test]
    fn a_lookup_finds_only_an_admitted_table_and_keeps_nothing() {
        let admitted = Admitted::default();
        let calls = Cell::new(0);
        let raw = table("llama");
        assert!(admitted.get("inference", "chat", &raw).is_none());
        assert!(admitted.is_empty());
        let kept = admitted
            .get_or_admit("inference", "chat", &raw, admit(&raw, &calls))
            .expect("admitted");
        let found = admitted
            .get("inference", "chat", &table("llama"))
            .expect("the same table is found");
        assert!(Arc::ptr_eq(&kept, &found));
        assert!(
            admitted
                .get("inference", "chat", &table("mistral"))
                .is_none()
        );
        assert!(admitted.get("inference", "other", &raw).is_none());
        assert!(admitted.get("training", "chat", &raw).is_none());
        assert_eq!(admitted.len(), 1);
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn a_changed_table_is_parsed_again() {
        let admitted = Admitted::default();
        let calls = Cell::new(0);
        let old = table("llama");
        admitted
            .get_or_admit("inference", "chat", &old, admit(&old, &calls))
            .expect("admitted");
        let new = table("mistral");
        let config = admitted
            .get_or_admit("inference", "chat", &new, admit(&new, &calls))
            .expect("admitted");
        assert_eq!(calls.get(), 2);
        assert_eq!(config.selection.model.as_deref(), Some("mistral"));
    }

    #[test]
    fn each_trigger_of_one_scaled_object_keeps_its_table() {
        let admitted = Admitted::default();
        let calls = Cell::new(0);
        let (chat, code) = (table("llama"), table("starcoder"));
        for _ in 0..3 {
            for raw in [&chat, &code] {
                admitted
                    .get_or_admit("inference", "both", raw, admit(raw, &calls))
                    .expect("admitted");
            }
        }
        assert_eq!(
            calls.get(),
            2,
            "each table parsed once, however the polls alternate"
        );
        assert_eq!(admitted.len(), 2);
    }

    #[test]
    fn the_least_recently_used_table_gives_way() {
        let admitted = Admitted::default();
        let calls = Cell::new(0);
        let tables: Vec<_> = (0..=TABLES_PER_OBJECT)
            .map(|i| table(&format!("model-{i}")))
            .collect();
        for raw in &tables {
            admitted
                .get_or_admit("inference", "edited", raw, admit(raw, &calls))
                .expect("admitted");
        }
        assert_eq!(admitted.len(), TABLES_PER_OBJECT);
        // The newest are kept; the first, least recently used, was dropped.
        let newest = &tables[TABLES_PER_OBJECT];
        admitted
            .get_or_admit("inference", "edited", newest, admit(newest, &calls))
            .expect("admitted");
        assert_eq!(calls.get(), TABLES_PER_OBJECT + 1);
        admitted
            .get_or_admit("inference", "edited", &tables[0], admit(&tables[0], &calls))
            .expect("admitted");
        assert_eq!(
            calls.get(),
            TABLES_PER_OBJECT + 2,
            "the dropped table is parsed again"
        );
    }

    #[test]
    fn a_failing_table_is_never_kept() {
        let admitted = Admitted::default();
        let calls = Cell::new(0);
        let good = table("llama");
        admitted
            .get_or_admit("inference", "chat", &good, admit(&good, &calls))
            .expect("admitted");
        let mut bad = table("llama");
        bad.insert("waitingTarget".into(), "many".into());
        for _ in 0..2 {
            let e = admitted.get_or_admit("inference", "chat", &bad, admit(&bad, &calls));
            assert!(matches!(e, Err(Error::Metadata(_))), "{e:?}");
        }
        assert_eq!(calls.get(), 3, "the bad table is parsed on every call");
        assert_eq!(admitted.len(), 1, "only the good table is kept");
    }

    #[test]
    fn scaled_objects_are_kept_apart_and_forgotten() {
        let admitted = Admitted::default();
        let calls = Cell::new(0);
        let raw = table("llama");
        for (ns, name) in [("a", "chat"), ("b", "chat"), ("a", "code")] {
            admitted
                .get_or_admit(ns, name, &raw, admit(&raw, &calls))
                .expect("admitted");
        }
        assert_eq!((calls.get(), admitted.len()), (3, 3));
        admitted.forget("a", "chat");
        admitted.forget("a", "code");
        admitted.forget("a", "missing");
        assert_eq!(admitted.len(), 1);
        assert!(!admitted.lock().contains_key("a"), "empty namespaces go");
    }
}
