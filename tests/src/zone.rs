//! The complete linearizability check of one register whose writes each write a value of their
//! own, by zones (Gibbons and Korach, "Testing shared memories", 1997): a history of such a
//! register is linearizable if and only if no read ends before the write it read began (the
//! caller checks that), no two forward zones overlap, and no backward zone lies inside another
//! value's forward zone.
//!
//! A value's cluster is its write and the reads that returned it. Let `f` be the earliest end
//! and `s` the latest start of those operations. When `f < s`, the value must be the register's
//! throughout `[f, s]`: that is its forward zone, and two values cannot both be current at once.
//! Otherwise the whole cluster can take effect at one point of `[s, f]`, its backward zone; it
//! cannot if that interval lies inside the span where another value must be current.
//!
//! The initial value is a write that ended before anything began. A write with no answer
//! may take effect at any later time: it ends at the end of time (one that no read returned
//! may never have taken effect, and is left out).

/// A point in time, in nanoseconds from a fixed instant.
pub type Nanos = i128;

/// The end of a write that took effect before anything began (the initial value).
pub const BEFORE_ALL: Nanos = Nanos::MIN;
/// The end of a write whose answer never came: it may take effect at any time after it began.
pub const NEVER_ANSWERED: Nanos = Nanos::MAX;

/// When one operation was sent and when its answer came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: Nanos,
    pub end: Nanos,
}

/// One value's cluster: its write and the reads that returned it.
#[derive(Clone, Debug)]
pub struct ValueOps {
    pub value: u64,
    pub write: Span,
    pub reads: Vec<Span>,
}

/// A value's zone: the interval from the earliest end to the latest start of its cluster,
/// forward when the earliest end comes first.
#[derive(Clone, Copy, Debug)]
struct Zone {
    value: u64,
    /// The earlier bound.
    low: Nanos,
    /// The later bound.
    high: Nanos,
}

/// Everything that makes the register's history not linearizable, as sentences naming the
/// values; empty when it is linearizable (given that no read ends before its write began).
pub fn zone_violations(values: &[ValueOps]) -> Vec<String> {
    let mut forward = Vec::new();
    let mut backward = Vec::new();
    for ops in values {
        let spans = || std::iter::once(&ops.write).chain(&ops.reads);
        let first_end = spans().map(|s| s.end).min().unwrap_or(BEFORE_ALL);
        let last_start = spans().map(|s| s.start).max().unwrap_or(BEFORE_ALL);
        if first_end < last_start {
            forward.push(Zone {
                value: ops.value,
                low: first_end,
                high: last_start,
            });
        } else {
            backward.push(Zone {
                value: ops.value,
                low: last_start,
                high: first_end,
            });
        }
    }
    forward.sort_by_key(|z| z.low);
    let mut out = Vec::new();
    // Sorted by their beginnings, two forward zones overlap only if some neighbours do.
    for pair in forward.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.low < a.high {
            out.push(format!(
                "values {} and {} must each be current throughout spans that overlap ({} and {})",
                a.value,
                b.value,
                show(a),
                show(b)
            ));
        }
    }
    for b in &backward {
        for a in forward.iter().take_while(|a| a.low < b.low) {
            if b.high < a.high {
                out.push(format!(
                    "value {} could take effect only within {}, while value {} must be current \
                     throughout {}",
                    b.value,
                    show(*b),
                    a.value,
                    show(*a)
                ));
            }
        }
    }
    out
}

/// A zone's bounds in milliseconds.
fn show(z: Zone) -> String {
    let ms = |t: Nanos| match t {
        BEFORE_ALL => "the start".to_string(),
        NEVER_ANSWERED => "the end".to_string(),
        t => format!("{:.3} ms", t as f64 / 1e6),
    };
    format!("{} to {}", ms(z.low), ms(z.high))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: Nanos, end: Nanos) -> Span {
        Span { start, end }
    }

    fn initial(reads: &[(Nanos, Nanos)]) -> ValueOps {
        value(0, (BEFORE_ALL, BEFORE_ALL), reads)
    }

    fn value(v: u64, write: (Nanos, Nanos), reads: &[(Nanos, Nanos)]) -> ValueOps {
        ValueOps {
            value: v,
            write: span(write.0, write.1),
            reads: reads.iter().map(|r| span(r.0, r.1)).collect(),
        }
    }

    #[test]
    fn sequential_writes_read_in_order_are_linearizable() {
        let h = [
            initial(&[(5, 8)]),
            value(1, (0, 10), &[(12, 15)]),
            value(2, (20, 30), &[(25, 40)]),
        ];
        assert!(zone_violations(&h).is_empty(), "{:?}", zone_violations(&h));
    }

    #[test]
    fn a_stale_read_lies_inside_the_newer_values_zone() {
        // 2 acknowledged at 30; a read from 35 returns 1.
        let h = [value(1, (0, 10), &[(35, 40)]), value(2, (20, 30), &[])];
        assert_eq!(zone_violations(&h).len(), 1, "{:?}", zone_violations(&h));
        // The initial value read after 1 was acknowledged.
        let h = [initial(&[(15, 20)]), value(1, (0, 10), &[])];
        assert_eq!(zone_violations(&h).len(), 1, "{:?}", zone_violations(&h));
    }

    #[test]
    fn values_read_alternately_overlap() {
        // Neither write was answered, so either may take effect first, but not 2, then 1,
        // then 2 again.
        let h = [
            value(1, (0, NEVER_ANSWERED), &[(30, 32)]),
            value(2, (20, NEVER_ANSWERED), &[(25, 28), (35, 38)]),
        ];
        assert_eq!(zone_violations(&h).len(), 1, "{:?}", zone_violations(&h));
        // 2, then 1 alone is fine: 1 took effect late.
        let h = [
            value(1, (0, NEVER_ANSWERED), &[(30, 32)]),
            value(2, (20, NEVER_ANSWERED), &[(25, 28)]),
        ];
        assert!(zone_violations(&h).is_empty(), "{:?}", zone_violations(&h));
        // Two values each read twice, interleaved: their forward zones overlap.
        let h = [
            value(1, (0, 5), &[(10, 12), (30, 32)]),
            value(2, (6, NEVER_ANSWERED), &[(20, 22), (40, 42)]),
        ];
        assert_eq!(zone_violations(&h).len(), 1, "{:?}", zone_violations(&h));
    }

    #[test]
    fn overlapping_reads_may_see_either_order() {
        let h = [
            value(1, (0, NEVER_ANSWERED), &[(35, 50)]),
            value(2, (20, 30), &[(45, 55)]),
        ];
        assert!(zone_violations(&h).is_empty(), "{:?}", zone_violations(&h));
    }
}
