//! Tests of the settings: merging flags, environment and the config file, and refusals.

use super::*;

#[test]
fn a_node_listening_away_from_its_peers_entry_is_warned_about() {
    let args = ServeArgs {
        peers: Some("1=127.0.0.1:7101,2=127.0.0.1:7102".into()),
        id: Some(2),
        ..ServeArgs::default()
    };
    let s = ServeSettings::resolve(&args, true).unwrap();
    let at = |a: &str| a.parse::<std::net::SocketAddr>().unwrap();
    let told = "127.0.0.1:7102";
    assert_eq!(s.listening_elsewhere(at("127.0.0.1:7102"), told), None);
    assert_eq!(s.listening_elsewhere(at("0.0.0.0:7102"), told), None);
    let moved = s.listening_elsewhere(at("127.0.0.1:7105"), told).unwrap();
    assert!(moved.contains("listens at 127.0.0.1:7105"), "{moved}");
    assert!(s.listening_elsewhere(at("10.0.0.2:7102"), told).is_some());
    // A name is not compared, and an address given with --advertise is the operator's.
    assert_eq!(
        s.listening_elsewhere(at("127.0.0.1:7105"), "meta-2:7102"),
        None
    );
    let advertised = ServeArgs {
        advertise: Some("127.0.0.1:7102".into()),
        ..args
    };
    let s = ServeSettings::resolve(&advertised, true).unwrap();
    assert_eq!(s.listening_elsewhere(at("127.0.0.1:7105"), told), None);
}

/// A node moved to a new address starts with its old `--peers` and its new `--advertise`;
/// only initializing a cluster from such `--peers` is refused.
#[test]
fn peers_that_name_this_node_elsewhere_matter_only_to_an_init() {
    let args = ServeArgs {
        peers: Some("1=127.0.0.1:7101,2=127.0.0.1:7102".into()),
        id: Some(2),
        advertise: Some("127.0.0.1:7105".into()),
        ..ServeArgs::default()
    };
    let s = ServeSettings::resolve(&args, false).unwrap();
    let err = s.initial_members("127.0.0.1:7105").unwrap_err();
    assert!(format!("{err:#}").contains("--peers"), "{err:#}");
    assert_eq!(
        s.initial_members("127.0.0.1:7102")
            .unwrap()
            .get(&2)
            .unwrap(),
        "127.0.0.1:7102"
    );
}

#[test]
fn defaults_of_the_commandless_mode() {
    let s = ServeSettings::resolve(&ServeArgs::default(), true).unwrap();
    assert_eq!(s.id, 1);
    assert_eq!(s.listen, "127.0.0.1:7101");
    assert_eq!(s.data_dir, PathBuf::from("metaserver-data"));
    assert!(s.init);
    assert_eq!(s.barrier, BarrierMode::Shared);
    let s = ServeSettings::resolve(&ServeArgs::default(), false).unwrap();
    assert!(!s.init, "serve initializes only with --init");
    // Another id is a member meant for a cluster (a forgotten `serve`): it waits to be
    // added, unless told to initialize.
    let four = ServeArgs {
        id: Some(4),
        ..ServeArgs::default()
    };
    assert!(!ServeSettings::resolve(&four, true).unwrap().init);
    let told = ServeArgs {
        init: Some(true),
        ..four
    };
    assert!(ServeSettings::resolve(&told, true).unwrap().init);
}

#[test]
fn peers_parse_and_refuse_garbage() {
    let p = parse_peers("1=127.0.0.1:7101, 2=127.0.0.1:7102,3=127.0.0.1:7103").unwrap();
    assert_eq!(p.len(), 3);
    assert_eq!(p[&2], "127.0.0.1:7102");
    assert!(parse_peers("1=a:1,1=b:2").is_err());
    assert!(parse_peers("1=a:1,2=a:1")
        .unwrap_err()
        .to_string()
        .contains("both at a:1"));
    assert!(parse_peers("x=a:1").is_err());
    assert!(parse_peers("1").is_err());
    assert!(parse_peers("1=nohost").is_err());
    assert!(parse_peers("-1=a:1").is_err());
    assert!(parse_peers("0=a:1").is_err());
    // A semicolon instead of a comma leaves no valid address.
    assert!(parse_peers("1=127.0.0.1:7121;2=127.0.0.1:7122").is_err());
    for empty in ["1=a:1,", "1=a:1,,2=b:2", ",1=a:1", "1=a:1, ,2=b:2"] {
        let e = parse_peers(empty).unwrap_err().to_string();
        assert!(e.contains("empty entry"), "{empty}: {e}");
    }
}

#[test]
fn load_settings_come_from_the_file_and_refuse_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.toml");
    std::fs::write(
        &path,
        "worker_threads = 1\nmax_pending_shards = 100\nemulated_sync_latency_us = 1500\nidle_timeout_secs = 0\nfollower_reads = false\nwatch_history = 10\nmin_free_bytes = 0\nstop_delay_ms = 2500\ndatanode_timeout_ms = 3000\n",
    )
    .unwrap();
    let args = ServeArgs {
        config: Some(path.clone()),
        ..ServeArgs::default()
    };
    let s = ServeSettings::resolve(&args, false).unwrap();
    assert_eq!(s.worker_threads, Some(1));
    assert_eq!(s.idle_timeout, None, "0 never closes idle connections");
    assert!(!s.follower_reads);
    assert_eq!(s.stop_delay, Duration::from_millis(2500));
    let cfg = s.node_config("127.0.0.1:1");
    assert_eq!(cfg.max_pending_shards, 100);
    assert_eq!(cfg.watch_history, 10);
    assert_eq!(cfg.min_free_bytes, 0);
    assert_eq!(cfg.datanode_timeout, Duration::from_secs(3));
    assert_eq!(cfg.emulated_sync_latency, Duration::from_micros(1500));
    let defaults = ServeSettings::resolve(&ServeArgs::default(), false).unwrap();
    assert_eq!(defaults.emulated_sync_latency, Duration::ZERO);
    assert_eq!(
        defaults.idle_timeout,
        Some(meta_http::server::DEFAULT_IDLE_TIMEOUT)
    );
    assert!(defaults.follower_reads);
    assert_eq!(defaults.stop_delay, Duration::ZERO);
    for bad in [
        "worker_threads = 0\n",
        "max_pending_shards = 0\n",
        "datanode_timeout_ms = 0\n",
    ] {
        std::fs::write(&path, bad).unwrap();
        let err = ServeSettings::resolve(&args, false).unwrap_err();
        assert!(format!("{err:#}").contains("at least 1"), "{bad}: {err:#}");
    }
}

/// Values that would quietly mean something else are refused: an empty token (no
/// authentication), empty peers (a cluster of one), a sled cache sled refuses by panicking,
/// an idle timeout the clock cannot add, no watch history, an address nobody can reach.
#[test]
fn empty_and_out_of_range_values_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.toml");
    std::fs::write(&file, "token = \"s3cret\"\n").unwrap();
    let d = ServeArgs::default;
    let cases = [
        (
            ServeArgs {
                token: Some(String::new()),
                ..d()
            },
            "--token",
        ),
        (
            ServeArgs {
                member_token: Some(" ".into()),
                ..d()
            },
            "--member-token",
        ),
        // A flag's empty token does not hide the file's either.
        (
            ServeArgs {
                config: Some(file.clone()),
                token: Some(String::new()),
                ..d()
            },
            "--token",
        ),
        (
            ServeArgs {
                peers: Some(" ".into()),
                ..d()
            },
            "--peers",
        ),
        (
            ServeArgs {
                sled_cache_bytes: Some(0),
                ..d()
            },
            "--sled-cache-bytes",
        ),
        (
            ServeArgs {
                idle_timeout_secs: Some(u64::MAX),
                ..d()
            },
            "--idle-timeout-secs",
        ),
        (
            ServeArgs {
                idle_timeout_secs: Some(4),
                ..d()
            },
            "at least 5",
        ),
        (
            ServeArgs {
                watch_history: Some(0),
                ..d()
            },
            "--watch-history",
        ),
        (
            ServeArgs {
                emulated_sync_latency_us: Some(u64::MAX),
                ..d()
            },
            "--emulated-sync-latency-us",
        ),
        (
            ServeArgs {
                advertise: Some("0.0.0.0:7101".into()),
                ..d()
            },
            "--advertise",
        ),
        (
            ServeArgs {
                peers: Some("2=[::]:7102".into()),
                ..d()
            },
            "unspecified",
        ),
        (
            ServeArgs {
                wal_segment_bytes: Some(64 << 30),
                ..d()
            },
            "--wal-segment-bytes",
        ),
        (
            ServeArgs {
                wal_segment_bytes: Some(1),
                ..d()
            },
            "--wal-segment-bytes",
        ),
        (
            ServeArgs {
                worker_threads: Some(1_000_000),
                ..d()
            },
            "--worker-threads",
        ),
        (
            ServeArgs {
                peers: Some("x".into()),
                ..d()
            },
            "--peers (METASERVER_PEERS): peer \"x\" is not ID=ADDR",
        ),
        (
            ServeArgs {
                listen: Some("nope".into()),
                ..d()
            },
            "--listen (METASERVER_LISTEN) \"nope\" is not host:port: no port",
        ),
        (
            ServeArgs {
                listen: Some("127.0.0.1:70000".into()),
                ..d()
            },
            "the port must be 0 (any free port) to 65535",
        ),
    ];
    for (args, what) in cases {
        let err = ServeSettings::resolve(&args, false).unwrap_err();
        assert!(format!("{err:#}").contains(what), "{what}: {err:#}");
    }
    // The same in a config file, named as its key there: an empty data dir would have put
    // the node's files in the working directory.
    for (line, what) in [
        ("data_dir = \"\"", "data_dir (in the config file) is empty"),
        ("token = \"\"", "token (in the config file) is empty"),
        (
            "token = \"abc\\n\"",
            "token (in the config file) begins or ends with whitespace",
        ),
        ("token = \"a b\"", "token (in the config file) holds ' '"),
        (
            "member_token = \"\\tm\"",
            "member_token (in the config file) begins or ends with whitespace",
        ),
        (
            "member_token = \" \"",
            "member_token (in the config file) is empty",
        ),
        ("peers = \"\"", "peers (in the config file) names no peer"),
        ("peers = \"x\"", "peers (in the config file): peer \"x\""),
        ("data_dir = \" \"", "data_dir (in the config file) is empty"),
        (
            "worker_threads = 0",
            "worker_threads (in the config file) must be at least 1",
        ),
        (
            "wal_segment_bytes = 10",
            "wal_segment_bytes (in the config file) must be between",
        ),
        (
            "idle_timeout_secs = 2",
            "idle_timeout_secs (in the config file) must be 0",
        ),
        ("barrier = \"foo\"", "barrier (in the config file) must be"),
        (
            "advertise = \"0.0.0.0:7101\"",
            "advertise (in the config file) 0.0.0.0:7101",
        ),
        (
            "listen = \"nope\"",
            "listen (in the config file) \"nope\" is not host:port",
        ),
    ] {
        let file = dir.path().join("empty.toml");
        std::fs::write(&file, format!("{line}\n")).unwrap();
        let args = ServeArgs {
            config: Some(file),
            ..d()
        };
        let err = ServeSettings::resolve(&args, false).unwrap_err();
        assert!(format!("{err:#}").contains(what), "{what}: {err:#}");
    }
    let args = ServeArgs {
        config: Some(file.clone()),
        ..d()
    };
    let s = ServeSettings::resolve(&args, false).unwrap();
    assert_eq!(s.token.as_deref(), Some("s3cret"));
    // Any free port, every interface, IPv6 and names are addresses to listen on.
    for listen in ["127.0.0.1:0", "0.0.0.0:7101", "[::1]:0", "localhost:7101"] {
        let args = ServeArgs {
            listen: Some(listen.into()),
            ..d()
        };
        assert_eq!(ServeSettings::resolve(&args, false).unwrap().listen, listen);
    }
    assert_eq!(s.member_token, None);
    std::fs::write(&file, "member_token = \"m3mber\"\n").unwrap();
    let s = ServeSettings::resolve(&args, false).unwrap();
    assert_eq!(s.member_token.as_deref(), Some("m3mber"));
    std::fs::write(&file, "snapshot_rate = 1\nsnapshot_max_bytes_per_sec = 2\n").unwrap();
    let err = format!("{:#}", ServeSettings::resolve(&args, false).unwrap_err());
    assert!(err.contains("two names of one setting"), "{err}");
}

#[test]
fn a_node_that_forms_a_cluster_must_give_an_address_members_can_reach() {
    let all: std::net::SocketAddr = "0.0.0.0:7101".parse().unwrap();
    let init = ServeSettings::resolve(&ServeArgs::default(), true).unwrap();
    let err = init.advertised(all).unwrap_err();
    assert!(format!("{err:#}").contains("--advertise"), "{err:#}");
    let args = ServeArgs {
        advertise: Some("10.0.0.7:7101".into()),
        ..ServeArgs::default()
    };
    let advertised = ServeSettings::resolve(&args, true).unwrap();
    assert_eq!(advertised.advertised(all).unwrap(), "10.0.0.7:7101");
    // A node that joins an existing cluster is given its address by the member that adds it.
    let join = ServeSettings::resolve(&ServeArgs::default(), false).unwrap();
    assert_eq!(join.advertised(all).unwrap(), "0.0.0.0:7101");
    let loopback = "127.0.0.1:7101".parse().unwrap();
    assert_eq!(init.advertised(loopback).unwrap(), "127.0.0.1:7101");
}

#[test]
fn barrier_modes() {
    assert_eq!(parse_barrier("own").unwrap(), BarrierMode::Own);
    assert_eq!(parse_barrier("shared").unwrap(), BarrierMode::Shared);
    assert!(parse_barrier("Own").is_err());
}

#[test]
fn flags_override_the_file_which_overrides_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.toml");
    std::fs::write(
        &path,
        "id = 2\nlisten = \"127.0.0.1:9000\"\nbarrier = \"own\"\nsnapshot_max_bytes_per_sec = 5\npeers = \"1=127.0.0.1:1,2=127.0.0.1:9000\"\n",
    )
    .unwrap();
    let args = ServeArgs {
        config: Some(path.clone()),
        id: Some(3),
        ..ServeArgs::default()
    };
    let s = ServeSettings::resolve(&args, false).unwrap();
    assert_eq!(s.id, 3);
    assert_eq!(s.listen, "127.0.0.1:9000");
    assert_eq!(s.barrier, BarrierMode::Own);
    assert_eq!(s.snapshot_rate, 5);
    assert_eq!(s.peers.len(), 2);
    assert_eq!(s.initial_members("127.0.0.1:9999").unwrap().len(), 3);
    let warning = s
        .unnamed_in_peers("127.0.0.1:9999")
        .expect("node 3 is not in --peers");
    assert!(warning.contains("a cluster of 3 voters"), "{warning}");
    // Node 3 may not take node 2's address, nor could node 2 answer elsewhere.
    assert!(s.initial_members("127.0.0.1:9000").is_err());
    let two = ServeArgs {
        config: Some(path.clone()),
        ..ServeArgs::default()
    };
    let s2 = ServeSettings::resolve(&two, false).unwrap();
    assert_eq!(s2.initial_members("127.0.0.1:9000").unwrap().len(), 2);
    assert_eq!(s2.unnamed_in_peers("127.0.0.1:9000"), None);
    let err = s2.initial_members("127.0.0.1:9001").unwrap_err();
    assert!(format!("{err:#}").contains("127.0.0.1:9000"), "{err:#}");

    // The flag's name works in the file too.
    std::fs::write(&path, "snapshot_rate = 7\n").unwrap();
    assert_eq!(
        ServeSettings::resolve(&args, false).unwrap().snapshot_rate,
        7
    );

    std::fs::write(&path, "idd = 2\n").unwrap();
    let err = ServeSettings::resolve(&args, false).unwrap_err();
    assert!(format!("{err:#}").contains("idd"), "{err:#}");

    let zero = ServeArgs {
        id: Some(0),
        ..ServeArgs::default()
    };
    assert!(ServeSettings::resolve(&zero, false).is_err());
}
