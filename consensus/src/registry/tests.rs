//! Tests of the registry: opening, its locks, paging, and reads during commits.

use super::*;

#[test]
fn a_held_lock_is_reported_as_contention_and_other_errors_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let held = open_db(dir.path(), 1 << 20).unwrap();
    let err = sled::Config::new().path(dir.path()).open().unwrap_err();
    assert!(is_lock_contention(&err), "{err}");
    let e = open_db_waiting(dir.path(), 1 << 20, Duration::ZERO, || {}).unwrap_err();
    assert!(e.to_string().contains("could not acquire lock"), "{e}");
    assert!(e.to_string().contains("still referenced"), "{e}");
    drop(held);

    // A path that is a file is not a lock problem: reported at once.
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let err = sled::Config::new().path(&file).open().unwrap_err();
    assert!(!is_lock_contention(&err), "{err}");
    // The file system's refusal names the registry dir.
    let e = open_db(&file, 1 << 20).unwrap_err();
    assert!(e.to_string().contains(&*file.to_string_lossy()), "{e}");
}

#[test]
fn open_waits_for_a_closing_handle_to_release_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let held = Registry::open(dir.path(), 1 << 20).unwrap();
    let (refused_tx, refused_rx) = std::sync::mpsc::channel();
    let path = dir.path().to_path_buf();
    let opener = std::thread::spawn(move || {
        let on_contention = move || {
            let _ = refused_tx.send(());
        };
        open_db_waiting(&path, 1 << 20, Duration::from_secs(60), on_contention).map(|_| ())
    });
    // Released only once the opener has found the lock held at least once.
    refused_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the opener meets the held lock");
    drop(held);
    opener.join().unwrap().unwrap();
}

/// A registry that failed a write is not flushed at its close (sled's flush can then wait
/// forever on a full disk) nor said to be closed cleanly: the next start rebuilds it.
#[test]
fn a_registry_that_failed_a_write_closes_without_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::open(dir.path(), 1 << 20).unwrap();
    reg.distrust();
    let err = reg.close().unwrap_err();
    assert!(err.to_string().contains("not flushed"), "{err}");
    assert!(
        dir.path().join("OPEN").exists(),
        "said to be closed cleanly"
    );
    assert!(!dir.path().join("TRUSTED").exists());
}

/// A registry that failed a write is abandoned when dropped, not closed: sled's trees flush when
/// dropped, and after a write failed on a full disk that flush waits for ever (a node restarted
/// on a full disk hung so). It stays open, its lock held, until the process exits; one that
/// did not fail is closed, its lock released.
#[test]
fn a_registry_that_failed_a_write_is_abandoned_when_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::open(dir.path(), 1 << 20).unwrap();
    reg.distrust();
    drop(reg);
    let e = open_db_waiting(dir.path(), 1 << 20, Duration::from_secs(2), || {}).unwrap_err();
    assert!(e.to_string().contains("could not acquire lock"), "{e}");
    let other = tempfile::tempdir().unwrap();
    drop(Registry::open(other.path(), 1 << 20).unwrap());
    open_db_waiting(other.path(), 1 << 20, Duration::from_secs(60), || {})
        .expect("a dropped registry that did not fail releases its lock");
}

/// Every page of the key-value space's entries, as keys, following `next` from the start.
fn kv_pages(reg: &Registry, limit: usize, max_bytes: usize) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = reg.kv_scan("", after.as_deref(), limit, max_bytes).unwrap();
        out.push(page.items.into_iter().map(|e| e.key).collect());
        match page.next {
            Some(next) => after = Some(next),
            None => return out,
        }
    }
}

#[test]
fn key_pages_end_at_their_byte_budget_and_the_next_starts_after_them() {
    use crate::apply_batch::ApplyBatch;
    use crate::command::Command;

    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::open(dir.path(), 1 << 20).unwrap();
    let g = reg.current();
    let mut batch = ApplyBatch::new(g.tree.clone(), g.replica_count().unwrap());
    for (i, key) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
        let put = Command::Put {
            key: key.into(),
            value: vec![0; 10],
            if_revision: None,
        };
        batch.execute(i as u64 + 1, &put).unwrap();
    }
    g.commit(batch.finish().unwrap()).unwrap();
    let keys = |pages: &[&[&str]]| -> Vec<Vec<String>> {
        pages
            .iter()
            .map(|p| p.iter().map(|k| k.to_string()).collect())
            .collect()
    };
    // The budget ends a page once its values reach it.
    assert_eq!(
        kv_pages(&reg, 4, 25),
        keys(&[&["a", "b", "c"], &["d", "e"]])
    );
    // The count ends it first.
    assert_eq!(
        kv_pages(&reg, 2, 1000),
        keys(&[&["a", "b"], &["c", "d"], &["e"]])
    );
    // A page holds at least one entry, however small the budget.
    assert_eq!(kv_pages(&reg, 4, 0).len(), 5);
    // Listings page by count alone.
    let listed = reg.kv_list("", None, 10).unwrap();
    assert_eq!(listed.items.len(), 5);
    assert_eq!(listed.next, None);
}

/// Commits one batch putting `puts` (key, value size) at indexes 1, 2, ...
fn put_all(reg: &Registry, puts: &[(&str, usize)]) {
    use crate::apply_batch::ApplyBatch;
    use crate::command::Command;

    let g = reg.current();
    let mut batch = ApplyBatch::new(g.tree.clone(), g.replica_count().unwrap());
    for (i, (key, len)) in puts.iter().enumerate() {
        let put = Command::Put {
            key: key.to_string(),
            value: vec![7; *len],
            if_revision: None,
        };
        batch.execute(i as u64 + 1, &put).unwrap();
    }
    g.commit(batch.finish().unwrap()).unwrap();
}

#[test]
fn a_listing_pages_keys_and_revisions_as_a_scan_pages_entries() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::open(dir.path(), 1 << 20).unwrap();
    let puts = [
        ("a", 3),
        ("a/1", 100_000),
        ("a/2", 0),
        ("a/3", 5),
        ("b", 1),
        ("b/x", 70_000),
    ];
    put_all(&reg, &puts);
    // Page after page, by count, the listing names what the scan returns: same keys,
    // revisions and cursors.
    for prefix in ["", "a", "a/", "b/", "c"] {
        for limit in [1, 2, 3, 10] {
            let mut after: Option<String> = None;
            loop {
                let listed = reg.kv_list(prefix, after.as_deref(), limit).unwrap();
                let scanned = reg
                    .kv_scan(prefix, after.as_deref(), limit, usize::MAX)
                    .unwrap();
                let scanned_keys: Vec<(String, u64)> = scanned
                    .items
                    .into_iter()
                    .map(|e| (e.key, e.revision))
                    .collect();
                let listed_keys: Vec<(String, u64)> = listed
                    .items
                    .into_iter()
                    .map(|k| (k.key, k.revision))
                    .collect();
                assert_eq!(listed_keys, scanned_keys, "{prefix:?} {limit} {after:?}");
                assert_eq!(listed.next, scanned.next, "{prefix:?} {limit} {after:?}");
                match listed.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
        }
    }
    let all = reg.kv_list("a/", None, 2).unwrap();
    let names: Vec<(&str, u64)> = all.items.iter().map(|k| (&k.key[..], k.revision)).collect();
    assert_eq!(names, [("a/1", 2), ("a/2", 3)]);
    let rest = reg.kv_list("a/", all.next.as_deref(), 2).unwrap();
    assert_eq!(rest.items.len(), 1);
    assert_eq!((&rest.items[0].key[..], rest.next), ("a/3", None));
}

#[test]
fn a_key_cursor_must_name_a_key_the_api_takes() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::open(dir.path(), 1 << 20).unwrap();
    put_all(&reg, &[("a", 1), ("b", 1)]);
    let after = |c: &str| reg.kv_list("", Some(c), 10).map(|p| p.items.len());
    assert_eq!(after(&keys::to_hex(b"a")).unwrap(), 1);
    let too_long = keys::to_hex(&[b'k'; MAX_KEY_BYTES + 1]);
    // Not UTF-8, a control character, no key at all, past any key's length, odd-length hex.
    for bad in ["ff", "00", "", too_long.as_str(), "616"] {
        assert!(
            matches!(after(bad), Err(Error::InvalidArgument(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn a_registry_whose_open_failed_a_write_is_not_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::open(dir.path(), 1 << 20).unwrap();
    put_all(&reg, &[("k", 1)]);
    drop(reg);
    FAIL_NEXT_REDO.with(|f| f.set(true));
    assert!(Registry::open(dir.path(), 1 << 20).is_err());
    // Space freed, the next start deletes the registry (the node rebuilds it from the
    // snapshot and the log) instead of trusting what sled kept.
    let reg = Registry::open(dir.path(), 1 << 20).unwrap();
    assert!(reg.kv_get("k").unwrap().is_none());
    assert!(dir.path().join("TRUSTED").exists());
}

/// A registry whose files sled cannot read (it panics on some damaged pages) is deleted and
/// opened empty, as one that failed a write: the node rebuilds it from the newest snapshot and
/// the log, instead of failing at every start.
#[test]
fn an_unreadable_registry_is_deleted_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::open(dir.path(), 1 << 20).unwrap();
    put_all(&reg, &[("k", 1)]);
    drop(reg);
    PANIC_IN_NEXT_OPEN.with(|f| f.set(true));
    let reg = Registry::open(dir.path(), 1 << 20).unwrap();
    assert!(!PANIC_IN_NEXT_OPEN.with(|f| f.get()), "sled was opened");
    assert!(reg.kv_get("k").unwrap().is_none());
    assert!(dir.path().join("TRUSTED").exists());
    drop(reg);
    // Once rebuilt, it is opened as any other.
    let reg = Registry::open(dir.path(), 1 << 20).unwrap();
    put_all(&reg, &[("k", 1)]);
    assert!(reg.kv_get("k").unwrap().is_some());
}

/// A listing is one point in time: a commit that a scan overlaps is in it whole or not at all.
/// The writer commits "a" and "z" together, the same number in both; thousands of keys between
/// them put them on different sled leaves, so a scan reads "a" well before "z".
#[test]
fn a_listing_sees_each_commit_whole_or_not_at_all() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    use crate::apply_batch::ApplyBatch;
    use crate::command::Command;

    let dir = tempfile::tempdir().unwrap();
    let reg = Arc::new(Registry::open(dir.path(), 1 << 20).unwrap());
    let commit = |reg: &Registry, index: u64, puts: &mut dyn Iterator<Item = (String, u64)>| {
        let g = reg.current();
        let mut batch = ApplyBatch::new(g.tree.clone(), g.replica_count().unwrap());
        for (key, n) in puts {
            let put = Command::Put {
                key,
                value: n.to_be_bytes().to_vec(),
                if_revision: None,
            };
            batch.execute(index, &put).unwrap();
        }
        g.commit(batch.finish().unwrap()).unwrap();
    };
    let mut filler = (0..5000).map(|i| (format!("m/{i:05}"), 0));
    commit(
        &reg,
        1,
        &mut filler.by_ref().chain([("a".into(), 0), ("z".into(), 0)]),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let writer = {
        let (reg, stop, committed) = (reg.clone(), stop.clone(), committed.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let mut puts = [("a".into(), n), ("z".into(), n)].into_iter();
                commit(&reg, n + 1, &mut puts);
                committed.store(n, Ordering::Relaxed);
            }
        })
    };
    let number = |page: &Page<KvEntry>, key: &str| {
        let e = page.items.iter().find(|e| e.key == key).unwrap();
        u64::from_be_bytes(e.value[..].try_into().unwrap())
    };
    let mut torn = None;
    // At least 50 listings while the writer made at least 50 commits (within a bound).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut listings = 0;
    while (listings < 50 || committed.load(Ordering::Relaxed) < 50)
        && std::time::Instant::now() < deadline
    {
        listings += 1;
        let page = reg.kv_scan("", None, MAX_PAGE, usize::MAX).unwrap();
        let (a, z) = (number(&page, "a"), number(&page, "z"));
        if a != z {
            torn = Some((a, z));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        committed.load(Ordering::Relaxed) >= 50,
        "the writer committed while the listings ran"
    );
    assert_eq!(torn, None, "a listing saw a commit in part (a, z)");
}

/// sled keeps a log message over about 128 KiB (here one large value) in a file of its own and
/// never fsyncs it: a power loss can take the file while later writes and last-applied
/// survive, and sled then opens without the value. So a registry left open when the machine
/// went down is deleted (to be rebuilt from the snapshot and the log), not reopened.
#[test]
fn a_registry_left_open_by_a_machine_that_went_down_is_deleted_not_reopened() {
    use crate::apply_batch::ApplyBatch;
    use crate::command::Command;
    use crate::trust_marker::BOOT;

    let in_boot = |boot: &str| BOOT.with(|b| *b.borrow_mut() = Some(boot.into()));
    let dir = tempfile::tempdir().unwrap();
    in_boot("boot-a");
    let reg = Registry::open(dir.path(), 1 << 20).unwrap();
    let leader = openraft::vote::leader_id_adv::LeaderId {
        term: 1,
        node_id: 1,
    };
    for (index, key, len) in [(1, "big", 200 << 10), (2, "small", 10)] {
        let g = reg.current();
        let mut batch = ApplyBatch::new(g.tree.clone(), g.replica_count().unwrap());
        let put = Command::Put {
            key: key.into(),
            value: vec![7; len],
            if_revision: None,
        };
        batch.execute(index, &put).unwrap();
        batch.set_applied(&crate::types::LogId::new(leader, index));
        g.commit(batch.finish().unwrap()).unwrap();
    }
    reg.flush().unwrap();
    drop(reg);
    // The power loss: the large value's own file was never made durable.
    let blobs: Vec<_> = std::fs::read_dir(dir.path().join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(
        !blobs.is_empty(),
        "sled kept the large value in a file of its own"
    );
    for blob in blobs {
        std::fs::remove_file(blob).unwrap();
    }

    in_boot("boot-b");
    let reg = Registry::open(dir.path(), 1 << 20).unwrap();
    BOOT.with(|b| *b.borrow_mut() = None);
    let (applied, _) = reg.current().applied().unwrap();
    let big = reg.kv_get("big").unwrap();
    assert!(
        applied.is_none(),
        "reopened at {applied:?} (the large value {}): it must be rebuilt",
        if big.is_some() { "is there" } else { "is lost" }
    );
}
