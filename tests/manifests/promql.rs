//! Just enough PromQL reading to check how a query aggregates a metric: where each selector of a
//! metric family stands, and which aggregation encloses it first. Not a parser: quoted strings
//! are skipped, parentheses matched, and the words before a parenthesis looked at.

/// PromQL's aggregation operators (a function call such as `rate(…)` is not one).
const AGGREGATIONS: [&str; 14] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The labels an aggregation keeps or drops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grouping {
    /// No clause: everything is aggregated into one series.
    All,
    By(Vec<String>),
    Without(Vec<String>),
}

impl Grouping {
    /// Whether series that differ only in `label` end up in the same group.
    pub fn merges(&self, label: &str) -> bool {
        match self {
            Self::All => true,
            Self::By(kept) => !kept.iter().any(|l| l == label),
            Self::Without(dropped) => dropped.iter().any(|l| l == label),
        }
    }
}

/// An aggregation around a selector: the operator and its grouping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Aggregation {
    pub op: String,
    pub grouping: Grouping,
}

/// One selector of a metric in a query.
#[derive(Clone, Debug)]
pub struct Selector {
    pub metric: String,
    /// The aggregation nearest around it, if any.
    pub aggregation: Option<Aggregation>,
    /// The text of the parenthesised group it stands in (the whole query at top level).
    pub group: String,
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// For each byte, whether it lies outside quoted strings, and the matching parenthesis of each
/// parenthesis (outside strings).
struct Structure {
    code: Vec<bool>,
    partner: Vec<Option<usize>>,
}

fn structure(expr: &str) -> Structure {
    let bytes = expr.as_bytes();
    let mut code = vec![true; bytes.len()];
    let mut partner = vec![None; bytes.len()];
    let mut open = Vec::new();
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if let Some(q) = quote {
            code[i] = false;
            if c == b'\\' && i + 1 < bytes.len() {
                code[i + 1] = false;
                i += 1;
            } else if c == q {
                quote = None;
            }
        } else if c == b'"' || c == b'\'' || c == b'`' {
            code[i] = false;
            quote = Some(c);
        } else if c == b'(' {
            open.push(i);
        } else if c == b')' {
            let start = open
                .pop()
                .unwrap_or_else(|| panic!("unbalanced ')' in {expr}"));
            partner[start] = Some(i);
            partner[i] = Some(start);
        }
        i += 1;
    }
    assert!(open.is_empty(), "unbalanced '(' in {expr}");
    assert!(quote.is_none(), "unterminated string in {expr}");
    Structure { code, partner }
}

fn skip_space_back(bytes: &[u8], mut end: usize) -> usize {
    while end > 0 && bytes[end - 1].is_ascii_whitespace() {
        end -= 1;
    }
    end
}

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while at < bytes.len() && bytes[at].is_ascii_whitespace() {
        at += 1;
    }
    at
}

/// The identifier that ends at `end` (exclusive), and where it starts.
fn word_before(expr: &str, end: usize) -> (&str, usize) {
    let bytes = expr.as_bytes();
    let mut start = end;
    while start > 0 && is_ident(bytes[start - 1]) {
        start -= 1;
    }
    (&expr[start..end], start)
}

fn label_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// A `by (…)` or `without (…)` clause starting at `at`, if there is one.
fn grouping_at(expr: &str, s: &Structure, at: usize) -> Option<Grouping> {
    let bytes = expr.as_bytes();
    let start = skip_space(bytes, at);
    let mut end = start;
    while end < bytes.len() && is_ident(bytes[end]) {
        end += 1;
    }
    let keyword = &expr[start..end];
    if keyword != "by" && keyword != "without" {
        return None;
    }
    let open = skip_space(bytes, end);
    let close = s.partner.get(open).copied().flatten()?;
    let labels = label_list(&expr[open + 1..close]);
    Some(if keyword == "by" {
        Grouping::By(labels)
    } else {
        Grouping::Without(labels)
    })
}

/// The aggregation whose body is the parenthesis opened at `open`, if that parenthesis is one.
fn aggregation_of(expr: &str, s: &Structure, open: usize) -> Option<Aggregation> {
    let bytes = expr.as_bytes();
    let before = skip_space_back(bytes, open);
    if before > 0 && bytes[before - 1] == b')' {
        // `op by (labels) (body)`: the clause stands between the operator and its body.
        let clause_open = s.partner[before - 1]?;
        let (_, keyword_start) = word_before(expr, skip_space_back(bytes, clause_open));
        let grouping = grouping_at(expr, s, keyword_start)?;
        let (op, _) = word_before(expr, skip_space_back(bytes, keyword_start));
        return AGGREGATIONS.contains(&op).then(|| Aggregation {
            op: op.to_string(),
            grouping,
        });
    }
    let (op, _) = word_before(expr, before);
    if !AGGREGATIONS.contains(&op) {
        return None;
    }
    // `op (body) by (labels)`, or no clause at all.
    let close = s.partner[open]?;
    let grouping = grouping_at(expr, s, close + 1).unwrap_or(Grouping::All);
    Some(Aggregation {
        op: op.to_string(),
        grouping,
    })
}

/// Every selector in `expr` of a metric whose name starts with `prefix`.
pub fn selectors(expr: &str, prefix: &str) -> Vec<Selector> {
    let s = structure(expr);
    let bytes = expr.as_bytes();
    let mut found = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !s.code[i] {
            i += 1;
            continue;
        }
        match bytes[i] {
            b'(' => open.push(i),
            b')' => {
                open.pop();
            }
            _ => {}
        }
        let starts_word = i == 0 || !is_ident(bytes[i - 1]);
        if starts_word && expr[i..].starts_with(prefix) {
            let mut end = i;
            while end < bytes.len() && is_ident(bytes[end]) {
                end += 1;
            }
            let aggregation = open.iter().rev().find_map(|&p| aggregation_of(expr, &s, p));
            let group = open.last().map_or(expr, |&p| {
                let close = s.partner[p].expect("matched");
                &expr[p + 1..close]
            });
            found.push(Selector {
                metric: expr[i..end].to_string(),
                aggregation,
                group: group.to_string(),
            });
            i = end;
            continue;
        }
        i += 1;
    }
    found
}

#[test]
fn finds_the_nearest_aggregation_around_each_selector() {
    let agg = |expr: &str| {
        let found = selectors(expr, "nightshift_pool_");
        assert_eq!(found.len(), 1, "{expr}");
        found[0].aggregation.clone()
    };
    let by = |op: &str, labels: &[&str]| {
        Some(Aggregation {
            op: op.into(),
            grouping: Grouping::By(labels.iter().map(|l| l.to_string()).collect()),
        })
    };
    assert_eq!(agg("nightshift_pool_gpus"), None);
    assert_eq!(
        agg("sum(nightshift_pool_gpus)"),
        Some(Aggregation {
            op: "sum".into(),
            grouping: Grouping::All
        })
    );
    assert_eq!(
        agg("sum by (state) (nightshift_pool_gpus)"),
        by("sum", &["state"])
    );
    assert_eq!(
        agg(
            r#"sum(max by (reason) (increase(nightshift_pool_preemptions_total{reason=~"(a|b)"}[1h])))"#
        ),
        by("max", &["reason"])
    );
    assert_eq!(
        agg("max (rate(nightshift_pool_lent_gpu_seconds_total[5m])) without (instance, pod)"),
        Some(Aggregation {
            op: "max".into(),
            grouping: Grouping::Without(vec!["instance".into(), "pod".into()])
        })
    );
    assert_eq!(
        agg("histogram_quantile(0.9, rate(nightshift_pool_x_bucket[5m]))"),
        None
    );
    let found = selectors(
        r#"label_replace(nightshift_pool_leader, "x", "nightshift_pool_y", "", "")"#,
        "nightshift_pool_",
    );
    assert_eq!(found.len(), 1, "names inside strings are not selectors");
}

#[test]
fn groupings_merge_the_labels_they_drop() {
    assert!(Grouping::All.merges("pod"));
    assert!(Grouping::By(vec!["state".into()]).merges("pod"));
    assert!(!Grouping::By(vec!["pod".into()]).merges("pod"));
    assert!(Grouping::Without(vec!["pod".into()]).merges("pod"));
    assert!(!Grouping::Without(vec!["instance".into()]).merges("pod"));
}
