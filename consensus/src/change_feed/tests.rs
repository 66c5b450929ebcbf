use std::sync::Arc;
use std::time::Duration;

use super::*;

fn put(index: u64, key: &str) -> ChangeEvent {
    ChangeEvent {
        index,
        change: Change::KvPut { key: key.into() },
    }
}

fn replicas(index: u64, datanode: u64, n: u64) -> ChangeEvent {
    ChangeEvent {
        index,
        change: Change::ReplicasRegistered {
            datanode,
            shards: (0..n).collect(),
        },
    }
}

fn indexes(b: &ChangeBatch) -> Vec<u64> {
    b.events.iter().map(|e| e.index).collect()
}

#[test]
fn reads_the_events_after_an_index_and_where_to_go_on() {
    let feed = ChangeFeed::new(10, 100);
    feed.record(vec![put(11, "a"), put(13, "b")], 13);
    feed.record(vec![], 15);
    let all = feed.read(10, &ChangeFilter::All, 100).unwrap();
    assert_eq!(indexes(&all), vec![11, 13]);
    assert_eq!(all.index, 15, "complete up to the applied index");
    let rest = feed.read(11, &ChangeFilter::All, 100).unwrap();
    assert_eq!(indexes(&rest), vec![13]);
    let none = feed.read(15, &ChangeFilter::All, 100).unwrap();
    assert!(none.events.is_empty());
    assert_eq!(none.index, 15);
    // An index from a member that applied more: nothing yet, and the index is kept.
    let ahead = feed.read(20, &ChangeFilter::All, 100).unwrap();
    assert_eq!((ahead.events.len(), ahead.index), (0, 20));
}

#[test]
fn a_full_page_resumes_after_its_last_event() {
    let feed = ChangeFeed::new(0, 100);
    feed.record((1..=5).map(|i| put(i, "k")).collect(), 7);
    let first = feed.read(0, &ChangeFilter::All, 2).unwrap();
    assert_eq!((indexes(&first), first.index), (vec![1, 2], 2));
    let second = feed.read(first.index, &ChangeFilter::All, 2).unwrap();
    assert_eq!((indexes(&second), second.index), (vec![3, 4], 4));
    let last = feed.read(second.index, &ChangeFilter::All, 2).unwrap();
    assert_eq!((indexes(&last), last.index), (vec![5], 7));
}

#[test]
fn a_page_holds_about_max_read_units_but_at_least_one_event() {
    let feed = ChangeFeed::new(0, 10 * MAX_READ_UNITS);
    let big = MAX_READ_UNITS as u64;
    feed.record(
        vec![replicas(1, 1, big), replicas(2, 1, 10), replicas(3, 1, 10)],
        3,
    );
    let first = feed.read(0, &ChangeFilter::All, 100).unwrap();
    assert_eq!((indexes(&first), first.index), (vec![1], 1));
    let rest = feed.read(1, &ChangeFilter::All, 100).unwrap();
    assert_eq!((indexes(&rest), rest.index), (vec![2, 3], 3));
}

#[test]
fn filters_pick_a_datanode_or_a_key_prefix() {
    let feed = ChangeFeed::new(0, 100);
    feed.record(
        vec![
            replicas(1, 7, 2),
            put(2, "config/a"),
            ChangeEvent {
                index: 3,
                change: Change::DatanodeRemoved {
                    id: 7,
                    replicas_removed: 2,
                },
            },
            put(4, "other"),
            replicas(5, 8, 1),
            ChangeEvent {
                index: 6,
                change: Change::KvDeleted {
                    key: "config/b".into(),
                },
            },
        ],
        6,
    );
    let dn = feed.read(0, &ChangeFilter::Datanode(7), 100).unwrap();
    assert_eq!((indexes(&dn), dn.index), (vec![1, 3], 6));
    let kv = feed
        .read(0, &ChangeFilter::KeyPrefix("config/".into()), 100)
        .unwrap();
    assert_eq!((indexes(&kv), kv.index), (vec![2, 6], 6));
}

#[test]
fn the_oldest_events_go_first_and_raise_the_floor() {
    let feed = ChangeFeed::new(0, 10);
    feed.record(vec![replicas(1, 1, 4), replicas(2, 1, 4)], 2);
    assert_eq!(feed.floor(), 0, "10 units fit");
    feed.record(vec![put(3, "k")], 3);
    assert_eq!(feed.floor(), 1, "event 1 dropped");
    assert_eq!(
        feed.read(0, &ChangeFilter::All, 10),
        Err(Compacted { floor: 1 })
    );
    assert_eq!(
        indexes(&feed.read(1, &ChangeFilter::All, 10).unwrap()),
        vec![2, 3]
    );
    feed.set_capacity(1);
    assert_eq!(feed.floor(), 2);
    assert_eq!(
        indexes(&feed.read(2, &ChangeFilter::All, 10).unwrap()),
        vec![3]
    );
}

#[test]
fn a_snapshot_install_forgets_the_history() {
    let feed = ChangeFeed::new(0, 100);
    feed.record(vec![put(1, "a"), put(2, "b")], 2);
    feed.restart_at(50);
    assert_eq!(
        feed.read(2, &ChangeFilter::All, 10),
        Err(Compacted { floor: 50 })
    );
    let b = feed.read(50, &ChangeFilter::All, 10).unwrap();
    assert_eq!((b.events.len(), b.index), (0, 50));
}

#[tokio::test]
async fn a_waiter_wakes_when_an_index_past_its_own_is_recorded() {
    let feed = Arc::new(ChangeFeed::new(5, 100));
    assert!(
        !feed
            .wait_past(5, &ChangeFilter::All, Duration::from_millis(20))
            .await
            .moved,
        "nothing new"
    );
    assert!(
        feed.wait_past(4, &ChangeFilter::All, Duration::from_millis(20))
            .await
            .moved,
        "5 is past 4"
    );
    let waiter = {
        let feed = feed.clone();
        tokio::spawn(async move {
            feed.wait_past(5, &ChangeFilter::All, Duration::from_secs(30))
                .await
                .moved
        })
    };
    // Whether the waiter subscribed before or after this, it sees 6.
    feed.record(vec![put(6, "k")], 6);
    let woke = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken long before its timeout")
        .unwrap();
    assert!(woke);
    assert_eq!(feed.waiting(), 0, "it waits no more");
}

#[tokio::test]
async fn waiters_are_counted_while_they_wait() {
    let feed = Arc::new(ChangeFeed::new(5, 100));
    let waiter = {
        let feed = feed.clone();
        tokio::spawn(async move {
            feed.wait_past(5, &ChangeFilter::All, Duration::from_secs(30))
                .await
                .moved
        })
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while feed.waiting() != 1 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the waiter is counted");
    feed.record(vec![], 6);
    let woke = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken long before its timeout")
        .unwrap();
    assert!(woke);
}

#[tokio::test]
async fn closing_wakes_every_waiter() {
    let feed = Arc::new(ChangeFeed::new(5, 100));
    let waiter = {
        let feed = feed.clone();
        tokio::spawn(async move {
            feed.wait_past(5, &ChangeFilter::All, Duration::from_secs(30))
                .await
                .moved
        })
    };
    feed.close();
    assert!(feed.closed());
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken long before its timeout")
        .unwrap();
    // A later record does not undo the close.
    feed.record(vec![], 7);
    assert!(feed.closed());
}

#[tokio::test]
async fn closing_wakes_a_waiter_at_the_largest_index() {
    let feed = Arc::new(ChangeFeed::new(5, 100));
    let waiter = {
        let feed = feed.clone();
        tokio::spawn(async move {
            feed.wait_past(u64::MAX, &ChangeFilter::All, Duration::from_secs(30))
                .await
                .moved
        })
    };
    feed.close();
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken long before its timeout")
        .unwrap();
}

#[test]
fn an_event_larger_than_the_history_is_kept_alone() {
    let feed = ChangeFeed::new(0, 3);
    feed.record(vec![replicas(1, 1, 10)], 1);
    assert_eq!(feed.floor(), 0, "the newest event stays");
    assert_eq!(
        indexes(&feed.read(0, &ChangeFilter::All, 10).unwrap()),
        vec![1]
    );
    feed.record(vec![put(2, "k")], 2);
    assert_eq!(feed.floor(), 1, "until a newer one comes");
    // A history of 0 keeps nothing.
    let none = ChangeFeed::new(0, 0);
    none.record(vec![put(1, "k")], 1);
    assert_eq!(
        none.read(0, &ChangeFilter::All, 10),
        Err(Compacted { floor: 1 })
    );
}

#[test]
fn a_read_looks_at_no_more_than_max_read_scan_events() {
    let n = MAX_READ_SCAN as u64 + 10;
    let feed = ChangeFeed::new(0, 2 * MAX_READ_SCAN);
    let mut events: Vec<_> = (1..=n).map(|i| put(i, "a")).collect();
    events.push(put(n + 1, "b"));
    feed.record(events, n + 1);
    let only_b = ChangeFilter::KeyPrefix("b".into());
    let first = feed.read(0, &only_b, 10).unwrap();
    assert!(first.events.is_empty());
    assert_eq!(
        first.index, MAX_READ_SCAN as u64,
        "where the next read starts"
    );
    let second = feed.read(first.index, &only_b, 10).unwrap();
    assert_eq!((indexes(&second), second.index), (vec![n + 1], n + 1));
    // A full page still resumes after the last event it looked at.
    let all = feed.read(0, &ChangeFilter::All, 3).unwrap();
    assert_eq!((indexes(&all), all.index), (vec![1, 2, 3], 3));
}

/// A long key costs the history its length, as shard ids do: a million puts of 1 KiB keys
/// must not fit a history meant for a million shard ids.
#[test]
fn a_long_key_costs_its_length_in_the_history() {
    let key = "k".repeat(1024);
    let feed = ChangeFeed::new(0, 10_000);
    feed.record((1..=1_000).map(|i| put(i, &key)).collect(), 1_000);
    // Each costs 129 units: the newest 77 fit.
    assert_eq!(feed.floor(), 1_000 - 77);
    let short = ChangeFeed::new(0, 10_000);
    short.record((1..=1_000).map(|i| put(i, "short")).collect(), 1_000);
    assert_eq!(short.floor(), 0, "a short key costs one unit");
}

fn registered(index: u64, datanode: u64) -> ChangeEvent {
    ChangeEvent {
        index,
        change: Change::ReplicasRegistered {
            datanode,
            shards: vec![1],
        },
    }
}

/// A waiter with a filter sleeps through the events it does not want (each wake costs the
/// member CPU), and wakes at one it wants, at a restart and at the close. Time is paused: a
/// timeout passes as soon as every task waits.
#[tokio::test(start_paused = true)]
async fn a_filtered_waiter_wakes_only_for_what_it_wants() {
    // A waiter past `index` for `filter`, answering whether the feed moved.
    let wait = |feed: &Arc<ChangeFeed>, index: u64, filter: &ChangeFilter| {
        let (feed, filter) = (feed.clone(), filter.clone());
        tokio::spawn(async move {
            feed.wait_past(index, &filter, Duration::from_secs(30))
                .await
                .moved
        })
    };
    for (filter, unwanted, wanted) in [
        (
            ChangeFilter::Datanode(7),
            registered(6, 8),
            registered(7, 7),
        ),
        (
            ChangeFilter::KeyPrefix("a/".into()),
            put(6, "b/1"),
            put(7, "a/1"),
        ),
    ] {
        let feed = Arc::new(ChangeFeed::new(5, 1000));
        let waiter = wait(&feed, 5, &filter);
        settled().await;
        feed.record(vec![unwanted.clone()], 6);
        settled().await;
        assert!(!waiter.is_finished(), "{filter:?} woke for {unwanted:?}");
        feed.record(vec![wanted.clone()], 7);
        assert!(waiter.await.unwrap(), "{filter:?} woke for {wanted:?}");
        // Applied past its index already: no wait.
        assert!(feed.wait_past(5, &filter, Duration::ZERO).await.moved);
        // Not woken at all: false once its time is up.
        let late = wait(&feed, 7, &filter);
        settled().await;
        feed.record(vec![unwanted], 8);
        assert!(!late.await.unwrap(), "{filter:?}");
    }
    // A restart and the close wake filtered waiters too.
    let feed = Arc::new(ChangeFeed::new(5, 1000));
    let waiter = wait(&feed, 5, &ChangeFilter::Datanode(7));
    settled().await;
    feed.restart_at(50);
    assert!(waiter.await.unwrap());
    // Past the index the restart set: a wait past an older one ends at once.
    let waiter = wait(&feed, 50, &ChangeFilter::KeyPrefix("a/".into()));
    settled().await;
    feed.close();
    assert!(waiter.await.unwrap());
    assert_eq!(feed.waiting(), 0);
}

/// A filtered wait that is dropped (its client went away) gives up its channel: the feed keeps
/// none for filters no one waits on.
#[tokio::test(start_paused = true)]
async fn a_dropped_filtered_wait_leaves_no_channel() {
    let feed = Arc::new(ChangeFeed::new(5, 1000));
    let waiters: Vec<_> = [
        ChangeFilter::Datanode(7),
        ChangeFilter::KeyPrefix("a/".into()),
    ]
    .into_iter()
    .map(|filter| {
        let feed = feed.clone();
        tokio::spawn(async move {
            feed.wait_past(5, &filter, Duration::from_secs(30))
                .await
                .moved
        })
    })
    .collect();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    {
        let wanted = feed.wanted.lock();
        assert_eq!((wanted.datanodes.len(), wanted.prefixes.len()), (1, 1));
    }
    for waiter in waiters {
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
    }
    let wanted = feed.wanted.lock();
    assert_eq!((wanted.datanodes.len(), wanted.prefixes.len()), (0, 0));
    assert_eq!(feed.waiting(), 0);
}

/// A filtered waiter that slept through changes it does not want may move its cursor past them:
/// the history, rolling on past its index meanwhile, would otherwise answer it 410 although it
/// missed nothing. Not past a wanted change, nor across a restart.
#[tokio::test(start_paused = true)]
async fn a_filtered_waiter_passes_the_changes_it_does_not_want() {
    let feed = Arc::new(ChangeFeed::new(5, 1000));
    let filter = ChangeFilter::KeyPrefix("p/".into());
    let wait = |index: u64| {
        let feed = feed.clone();
        let filter = filter.clone();
        tokio::spawn(async move {
            feed.wait_past(index, &filter, Duration::from_secs(30))
                .await
        })
    };
    let waiter = wait(5);
    settled().await;
    for i in 6..50 {
        feed.record(vec![put(i, "other")], i);
    }
    let waited = waiter.await.unwrap();
    assert!(!waited.moved);
    assert_eq!(waited.quiet_until, 49);

    // A wanted change: the cursor stays, and the read from it finds the change.
    let waiter = wait(49);
    settled().await;
    feed.record(vec![put(50, "other"), put(51, "p/x")], 51);
    let waited = waiter.await.unwrap();
    assert!(waited.moved);
    assert_eq!(waited.quiet_until, 49);
    let events = feed.read(49, &filter, 10).unwrap().events;
    assert_eq!(events, vec![put(51, "p/x")]);

    // A restart: what changed before it is not known, so the cursor stays and is compacted.
    let waiter = wait(51);
    settled().await;
    feed.restart_at(80);
    let waited = waiter.await.unwrap();
    assert_eq!(waited.quiet_until, 51);
    assert!(feed.read(51, &filter, 10).is_err());
}

/// Lets every other task run until it waits.
async fn settled() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// A watch with a filter, waiting while the history rolls on with changes it does not want
/// (ten units here), is woken as it rolls by half, to move its cursor: the change it wants, when
/// it comes, is read from there, not answered 410.
#[tokio::test(start_paused = true)]
async fn a_filtered_watch_keeps_up_with_a_rolling_history() {
    let feed = Arc::new(ChangeFeed::new(5, 10));
    let filter = ChangeFilter::KeyPrefix("p/".into());
    // What a long poll does (`MetaNode::watch`): read, else wait and move on.
    let watch = {
        let feed = feed.clone();
        tokio::spawn(async move {
            let mut after = 5;
            loop {
                let batch = feed.read(after, &filter, 10)?;
                if !batch.events.is_empty() {
                    return Ok(batch.events);
                }
                after = batch.index;
                after = feed
                    .wait_past(after, &filter, Duration::from_secs(300))
                    .await
                    .quiet_until;
            }
        })
    };
    settled().await;
    for i in 6..50 {
        feed.record(vec![put(i, "other")], i);
        settled().await;
    }
    assert!(
        feed.read(5, &ChangeFilter::All, 10).is_err(),
        "rolled past 5"
    );
    feed.record(vec![put(50, "p/x")], 50);
    let events: Result<_, Compacted> = watch.await.unwrap();
    assert_eq!(events, Ok(vec![put(50, "p/x")]));
}
