//! The NCCL unique-id exchange over loopback, each chief and worker task in its own thread; with
//! a cluster key, without one, and against strangers and a process squatting on the leader's port.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use distribute_device_spec::{ClusterSpec, TaskId, TaskType};
use distribute_nccl_exchange::ExchangeError;
use distribute_nccl_exchange::{
    ClusterKey, UNIQUE_ID_BYTES, exchange_unique_id, exchange_unique_id_unauthenticated,
    exchange_unique_id_with_key, nccl_rank,
};

/// Long enough for a loaded machine, short enough that a failing test fails fast.
const TIMEOUT: Duration = Duration::from_secs(3);
/// For tests that wait for the leader to give up.
const SHORT: Duration = Duration::from_millis(1200);

type Outcome = Result<[u8; UNIQUE_ID_BYTES], ExchangeError>;

fn the_id() -> [u8; UNIQUE_ID_BYTES] {
    std::array::from_fn(|i| (i * 7 + 3) as u8)
}

/// A loopback address on a port that was free a moment ago, never one this process has handed
/// out before: the kernel may give a port it just released to the next bind, and two tasks of a
/// cluster on one address are a `DuplicateAddress` error, not the case under test.
fn free_address() -> String {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return format!("127.0.0.1:{port}");
        }
    }
}

/// A cluster on loopback: a chief or not, `workers` workers and a parameter server (no rank).
fn loopback_cluster(chief: bool, workers: usize) -> ClusterSpec {
    let mut jobs = vec![
        (
            TaskType::Worker,
            (0..workers).map(|_| free_address()).collect(),
        ),
        (TaskType::Ps, vec![free_address()]),
    ];
    if chief {
        jobs.push((TaskType::Chief, vec![free_address()]));
    }
    ClusterSpec::new(jobs).unwrap()
}

fn chief() -> TaskId {
    TaskId::new(TaskType::Chief, 0)
}

fn worker(index: u32) -> TaskId {
    TaskId::new(TaskType::Worker, index)
}

/// The ranks of `cluster` in rank order.
fn ranks(cluster: &ClusterSpec) -> Vec<TaskId> {
    let chiefs = cluster.tasks(TaskType::Chief).len() as u32;
    let workers = cluster.tasks(TaskType::Worker).len() as u32;
    (0..chiefs)
        .map(|_| chief())
        .chain((0..workers).map(worker))
        .collect()
}

/// Runs `task`'s side of the exchange in a thread; the leader passes [`the_id`].
fn spawn(cluster: &ClusterSpec, task: TaskId, timeout: Duration) -> JoinHandle<Outcome> {
    spawn_keyed(cluster, task, Some(key()), the_id(), timeout)
}

/// The cluster's key in the tests that have one.
fn key() -> ClusterKey {
    ClusterKey::from_hex("6b1f0c9e2d4a87b35e90f1c2a4d6e8f700112233445566778899aabbccddeeff")
        .unwrap()
}

/// Another key, as a stranger or a squatter would have.
fn wrong_key() -> ClusterKey {
    ClusterKey::from_hex("00000000000000000000000000000000").unwrap()
}

/// [`spawn`] with `key`; the leader passes `id`.
fn spawn_keyed(
    cluster: &ClusterSpec,
    task: TaskId,
    key: Option<ClusterKey>,
    id: [u8; UNIQUE_ID_BYTES],
    timeout: Duration,
) -> JoinHandle<Outcome> {
    let cluster = cluster.clone();
    thread::spawn(move || {
        let id = nccl_rank(&cluster, task).unwrap().is_leader().then_some(id);
        exchange(&cluster, task, id, key.as_ref(), timeout)
    })
}

/// The exchange with `key`, or without one through the named opt-out.
fn exchange(
    cluster: &ClusterSpec,
    task: TaskId,
    id: Option<[u8; UNIQUE_ID_BYTES]>,
    key: Option<&ClusterKey>,
    timeout: Duration,
) -> Outcome {
    match key {
        Some(key) => exchange_unique_id_with_key(cluster, task, id, key, timeout),
        None => exchange_unique_id_unauthenticated(cluster, task, id, timeout),
    }
}

fn spawn_all(
    cluster: &ClusterSpec,
    tasks: &[TaskId],
    timeout: Duration,
) -> Vec<JoinHandle<Outcome>> {
    tasks
        .iter()
        .map(|&task| spawn(cluster, task, timeout))
        .collect()
}

fn assert_all_get_the_id(tasks: &[TaskId], handles: Vec<JoinHandle<Outcome>>) {
    for (task, handle) in tasks.iter().zip(handles) {
        assert_eq!(handle.join().unwrap(), Ok(the_id()), "{task}");
    }
}

/// Connects to `address`, retrying while its listener is not up yet.
fn connect(address: &str) -> TcpStream {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match TcpStream::connect(address) {
            Ok(stream) => return stream,
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("{address}: {e}"),
        }
    }
}

#[test]
fn every_task_gets_the_chiefs_id() {
    let cluster = loopback_cluster(true, 3);
    let tasks = ranks(&cluster);
    assert_eq!(tasks[0], chief());
    let handles = spawn_all(&cluster, &tasks, TIMEOUT);
    assert_all_get_the_id(&tasks, handles);
}

#[test]
fn without_a_chief_worker_0_leads() {
    let cluster = loopback_cluster(false, 4);
    let tasks = ranks(&cluster);
    assert!(nccl_rank(&cluster, worker(0)).unwrap().is_leader());
    assert_eq!(nccl_rank(&cluster, worker(3)).unwrap().rank, 3);
    let handles = spawn_all(&cluster, &tasks, TIMEOUT);
    assert_all_get_the_id(&tasks, handles);
}

#[test]
fn the_others_wait_for_a_leader_that_starts_last() {
    let cluster = loopback_cluster(true, 2);
    let tasks = ranks(&cluster);
    let mut handles = spawn_all(&cluster, &tasks[1..], TIMEOUT);
    thread::sleep(Duration::from_millis(300));
    handles.insert(0, spawn(&cluster, chief(), TIMEOUT));
    assert_all_get_the_id(&tasks, handles);
}

#[test]
fn a_single_task_gets_its_own_id_without_networking() {
    // The address could not be bound: nothing listens.
    let cluster = ClusterSpec::new([(TaskType::Worker, vec!["no-such-host.invalid:1".into()])]);
    let outcome = exchange_unique_id(&cluster.unwrap(), worker(0), Some(the_id()), TIMEOUT);
    assert_eq!(outcome, Ok(the_id()));
}

#[test]
fn the_leader_names_the_task_that_never_came() {
    let cluster = loopback_cluster(true, 3);
    // The others wait longer than the leader, so none has given up when it does.
    let leader = spawn(&cluster, chief(), SHORT);
    let handles = spawn_all(&cluster, &[worker(0), worker(1)], TIMEOUT);
    let leader = leader.join().unwrap().unwrap_err();
    let ExchangeError::Timeout { task, missing, .. } = &leader else {
        panic!("{leader}");
    };
    assert_eq!(
        (task.as_str(), missing.as_slice()),
        ("chief:0", &["worker:2".to_owned()][..])
    );
    assert!(
        leader
            .to_string()
            .contains("tasks [worker:2] to join it at 127.0.0.1:"),
        "{leader}"
    );
    // The others learn it from the leader, or time out on their own: never a hang.
    for handle in handles {
        let error = handle.join().unwrap().unwrap_err();
        assert!(matches!(error, ExchangeError::Timeout { .. }), "{error}");
    }
}

#[test]
fn a_task_without_a_leader_names_the_leaders_address() {
    let cluster = loopback_cluster(false, 2);
    let address = &cluster.tasks(TaskType::Worker)[0];
    let error = spawn(&cluster, worker(1), Duration::from_millis(500))
        .join()
        .unwrap()
        .unwrap_err();
    let ExchangeError::Timeout { task, missing, .. } = &error else {
        panic!("{error}");
    };
    assert_eq!(
        (task.as_str(), missing.as_slice()),
        ("worker:1", &["worker:0".to_owned()][..])
    );
    let message = error.to_string();
    assert!(
        message.contains(&format!("the leader worker:0 at {address}")),
        "{message}"
    );
    assert!(message.contains("Connection refused"), "{message}");
}

#[test]
fn only_the_leader_passes_an_id() {
    let cluster = loopback_cluster(true, 1);
    for (task, id, expected) in [
        (
            worker(0),
            Some(the_id()),
            "worker:0 is rank 1, not the leader of the unique-id exchange (chief:0 is)",
        ),
        (
            chief(),
            None,
            "chief:0 leads the unique-id exchange of this cluster",
        ),
    ] {
        let error = exchange(&cluster, task, id, Some(&key()), TIMEOUT).unwrap_err();
        assert!(
            matches!(&error, ExchangeError::InvalidArgument(m) if m.contains(expected)),
            "{error}"
        );
    }
}

#[test]
fn tasks_outside_the_ranks_are_refused() {
    let cluster = loopback_cluster(true, 2);
    let ps = TaskId::new(TaskType::Ps, 0);
    let evaluator = TaskId::new(TaskType::Evaluator, 0);
    for (task, expected) in [
        (worker(2), "index 2"),
        (ps, "ps:0 takes no part in the NCCL unique-id exchange"),
        (evaluator, "evaluator:0 takes no part"),
    ] {
        let error = exchange(&cluster, task, None, Some(&key()), TIMEOUT).unwrap_err();
        assert!(error.to_string().contains(expected), "{task}: {error}");
        assert!(
            matches!(
                error,
                ExchangeError::Device(_) | ExchangeError::InvalidArgument(_)
            ),
            "{error}"
        );
    }
}

/// Worker 1 runs with `its_cluster` instead of the leader's: it is refused, and the leader times
/// out naming it and saying why it refused the impostor.
fn refused_with_another_cluster(leaders: &ClusterSpec, its_cluster: &ClusterSpec, expected: &str) {
    let leader = spawn(leaders, chief(), SHORT);
    let worker_0 = spawn(leaders, worker(0), TIMEOUT);
    let impostor = spawn(its_cluster, worker(1), TIMEOUT)
        .join()
        .unwrap()
        .unwrap_err();
    let ExchangeError::Refused {
        task,
        leader: led_by,
        reason,
        ..
    } = &impostor
    else {
        panic!("{impostor}");
    };
    assert_eq!((task.as_str(), led_by.as_str()), ("worker:1", "chief:0"));
    assert!(reason.contains(expected), "{impostor}");

    let error = leader.join().unwrap().unwrap_err();
    assert!(
        matches!(&error, ExchangeError::Timeout { missing, .. }
            if missing == &["worker:1"]),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("meanwhile: refused worker:1 from 127.0.0.1:"),
        "{error}"
    );
    assert!(error.to_string().contains(expected), "{error}");
    assert!(worker_0.join().unwrap().is_err());
}

#[test]
fn a_task_with_other_addresses_is_refused() {
    let cluster = loopback_cluster(true, 2);
    let mut workers = cluster.tasks(TaskType::Worker).to_vec();
    workers[1] = free_address();
    let other = ClusterSpec::new([
        (TaskType::Chief, cluster.tasks(TaskType::Chief).to_vec()),
        (TaskType::Worker, workers),
    ]);
    refused_with_another_cluster(
        &cluster,
        &other.unwrap(),
        "its cluster spec differs from the leader's",
    );
}

#[test]
fn a_task_with_more_workers_is_refused() {
    let cluster = loopback_cluster(true, 2);
    let mut workers = cluster.tasks(TaskType::Worker).to_vec();
    workers.push(free_address());
    let other = ClusterSpec::new([
        (TaskType::Chief, cluster.tasks(TaskType::Chief).to_vec()),
        (TaskType::Worker, workers),
    ]);
    refused_with_another_cluster(
        &cluster,
        &other.unwrap(),
        "its cluster spec has 4 chief and worker tasks, the leader's has 3",
    );
}

#[test]
fn garbage_and_silent_connections_do_not_hold_up_the_others() {
    let cluster = loopback_cluster(true, 2);
    let address = cluster.tasks(TaskType::Chief)[0].clone();
    let leader = spawn(&cluster, chief(), TIMEOUT);

    let (connected, all_connected) = mpsc::channel();
    let (done, release) = mpsc::channel::<()>();
    let strays = thread::spawn(move || {
        let mut junk = connect(&address);
        junk.write_all(b"GET / HTTP/1.1\r\nHost: leader\r\n\r\n")
            .unwrap();
        let mut half_a_hello = connect(&address);
        half_a_hello.write_all(b"dst-uid\0\0").unwrap();
        drop(half_a_hello);
        let silent = connect(&address);
        connected.send(()).unwrap();
        // The leader refuses junk (or resets the connection): it never sends it the id.
        let mut answer = Vec::new();
        junk.set_read_timeout(Some(TIMEOUT)).unwrap();
        let _ = junk.read_to_end(&mut answer);
        assert!(
            !answer.windows(UNIQUE_ID_BYTES).any(|w| w == the_id()),
            "junk got the id"
        );
        let _ = release.recv_timeout(TIMEOUT);
        drop(silent);
    });
    all_connected.recv_timeout(TIMEOUT).unwrap();

    let tasks = ranks(&cluster);
    let mut handles = spawn_all(&cluster, &tasks[1..], TIMEOUT);
    handles.insert(0, leader);
    assert_all_get_the_id(&tasks, handles);
    done.send(()).unwrap();
    strays.join().unwrap();
}

#[test]
fn a_task_that_joins_twice_is_refused_the_second_time() {
    let cluster = loopback_cluster(false, 3);
    let leader = spawn(&cluster, worker(0), TIMEOUT);
    let first = spawn(&cluster, worker(1), TIMEOUT);
    thread::sleep(Duration::from_millis(300));
    let second = spawn(&cluster, worker(1), TIMEOUT);
    thread::sleep(Duration::from_millis(300));
    let last = spawn(&cluster, worker(2), TIMEOUT);

    let mut outcomes = [first.join().unwrap(), second.join().unwrap()];
    outcomes.sort_by_key(Result::is_err);
    assert_eq!(outcomes[0], Ok(the_id()));
    let error = outcomes[1].as_ref().unwrap_err();
    assert!(
        matches!(error, ExchangeError::Refused { reason, .. }
            if reason.starts_with("worker:1 already joined from 127.0.0.1:")),
        "{error}"
    );
    assert_eq!(leader.join().unwrap(), Ok(the_id()));
    assert_eq!(last.join().unwrap(), Ok(the_id()));
}

#[test]
fn a_leader_address_that_cannot_be_used_is_named() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_address = taken.local_addr().unwrap().to_string();
    for (address, expected) in [
        ("no-port".to_owned(), "'no-port' is not host:port"),
        ("127.0.0.1:http".to_owned(), "has port 'http'"),
        // TEST-NET-1: not this machine's.
        (
            "192.0.2.1:2222".to_owned(),
            "cannot be bound as 192.0.2.1:2222",
        ),
        (
            "no-such-host.invalid:2222".to_owned(),
            "'no-such-host.invalid:2222' does not resolve",
        ),
        (
            taken_address.clone(),
            "another process listens on that port",
        ),
    ] {
        let cluster =
            ClusterSpec::new([(TaskType::Worker, vec![address.clone(), free_address()])]).unwrap();
        // Not loopback: a cluster across hosts needs a key.
        let key = key();
        let error = exchange_unique_id_with_key(&cluster, worker(0), Some(the_id()), &key, SHORT)
            .unwrap_err();
        assert!(
            matches!(&error, ExchangeError::Address { task, .. } if task == "worker:0"),
            "{address}: {error}"
        );
        assert!(error.to_string().contains(expected), "{error}");
    }
    // The others check the leader's address too, rather than retrying a hopeless one.
    let cluster = ClusterSpec::new([(TaskType::Worker, vec!["no-port".into(), free_address()])]);
    let error = exchange(&cluster.unwrap(), worker(1), None, Some(&key()), SHORT).unwrap_err();
    assert!(matches!(error, ExchangeError::Address { .. }), "{error}");
    drop(taken);
}

#[test]
fn a_task_that_gave_up_may_join_again() {
    let cluster = loopback_cluster(true, 2);
    let leader = spawn(&cluster, chief(), TIMEOUT);
    let impatient = spawn(&cluster, worker(0), Duration::from_millis(300));
    let error = impatient.join().unwrap().unwrap_err();
    assert!(matches!(error, ExchangeError::Timeout { .. }), "{error}");

    let tasks = ranks(&cluster);
    let mut handles = spawn_all(&cluster, &tasks[1..], TIMEOUT);
    handles.insert(0, leader);
    assert_all_get_the_id(&tasks, handles);
}

#[test]
fn the_leader_counts_a_task_that_gave_up_as_missing() {
    let cluster = loopback_cluster(true, 2);
    let leader = spawn(&cluster, chief(), SHORT);
    let impatient = spawn(&cluster, worker(0), Duration::from_millis(300));
    assert!(impatient.join().unwrap().is_err());
    let error = leader.join().unwrap().unwrap_err();
    assert!(
        matches!(&error, ExchangeError::Timeout { missing, .. }
            if missing == &["worker:0", "worker:1"]),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("closed its connection before the id was sent"),
        "{error}"
    );
}

#[test]
fn with_a_key_every_task_gets_the_id() {
    for (chief, workers) in [(true, 3), (false, 2)] {
        let cluster = loopback_cluster(chief, workers);
        let tasks = ranks(&cluster);
        let spawn = |task| spawn_keyed(&cluster, task, Some(key()), the_id(), TIMEOUT);
        // The leader starts last: the others wait for it.
        let mut handles: Vec<_> = tasks[1..].iter().map(|&task| spawn(task)).collect();
        thread::sleep(Duration::from_millis(100));
        handles.insert(0, spawn(tasks[0]));
        assert_all_get_the_id(&tasks, handles);
    }
}

#[test]
fn a_stranger_without_the_key_gets_nothing_and_the_real_task_still_joins() {
    let cluster = loopback_cluster(true, 2);
    let leader = spawn_keyed(&cluster, chief(), Some(key()), the_id(), TIMEOUT);
    // Strangers with the right cluster spec come first, claiming worker:1: one without a key,
    // one with another key.
    let strangers = [None, Some(wrong_key())]
        .map(|key| spawn_keyed(&cluster, worker(1), key, [0; UNIQUE_ID_BYTES], TIMEOUT));
    thread::sleep(Duration::from_millis(200));
    let tasks = ranks(&cluster);
    let mut handles: Vec<_> = tasks[1..]
        .iter()
        .map(|&task| spawn_keyed(&cluster, task, Some(key()), [0; UNIQUE_ID_BYTES], TIMEOUT))
        .collect();
    handles.insert(0, leader);

    let [no_key, other_key] = strangers.map(|stranger| stranger.join().unwrap());
    let no_key = no_key.unwrap_err();
    assert!(
        matches!(&no_key, ExchangeError::Refused { reason, .. }
            if reason.contains("this one has no cluster key")),
        "{no_key}"
    );
    // A stranger with another key finds the leader does not know its key either.
    let other_key = other_key.unwrap_err();
    assert!(
        matches!(other_key, ExchangeError::Unauthenticated { .. }),
        "{other_key}"
    );
    assert_all_get_the_id(&tasks, handles);
}

#[test]
fn a_replayed_hello_with_a_guessed_proof_is_refused() {
    let cluster = loopback_cluster(true, 2);
    let hello = recorded_hello(&cluster);
    let leader = spawn_keyed(&cluster, chief(), Some(key()), the_id(), TIMEOUT);
    let address = cluster.tasks(TaskType::Chief)[0].clone();
    let guesser = thread::spawn(move || {
        let mut stream = connect(&address);
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        stream.write_all(&hello).unwrap();
        let mut challenge = [0; 10 + 1 + 64];
        stream.read_exact(&mut challenge).unwrap();
        assert_eq!(challenge[10], 3, "not a challenge");
        stream.write_all(&[0x5a; 32]).unwrap();
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        answer
    });
    let answer = guesser.join().unwrap();
    assert_eq!(answer[10], 1, "not a refusal: {answer:?}");
    assert!(
        String::from_utf8_lossy(&answer).contains("did not prove it knows the cluster key"),
        "{answer:?}"
    );
    let tasks = ranks(&cluster);
    let mut handles: Vec<_> = tasks[1..]
        .iter()
        .map(|&task| spawn_keyed(&cluster, task, Some(key()), [0; UNIQUE_ID_BYTES], TIMEOUT))
        .collect();
    handles.insert(0, leader);
    assert_all_get_the_id(&tasks, handles);
}

/// The 60 bytes worker:1 of `cluster` says first, recorded on the leader's port before the leader
/// starts, as an eavesdropper could.
fn recorded_hello(cluster: &ClusterSpec) -> Vec<u8> {
    let listener = TcpListener::bind(&cluster.tasks(TaskType::Chief)[0]).unwrap();
    let task = spawn_keyed(cluster, worker(1), Some(key()), [0; UNIQUE_ID_BYTES], SHORT);
    let (mut stream, _) = listener.accept().unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut hello = vec![0; 60];
    stream.read_exact(&mut hello).unwrap();
    drop((stream, listener));
    assert!(task.join().unwrap().is_err());
    hello
}

/// Every worker of `cluster` (with the key) against whatever holds the chief's port: each fails
/// with an error `check` accepts, and none gets an id.
fn workers_see_through(cluster: &ClusterSpec, check: impl Fn(&ExchangeError) -> bool) {
    let workers = ranks(cluster)[1..].to_vec();
    let handles: Vec<_> = workers
        .iter()
        .map(|&task| spawn_keyed(cluster, task, Some(key()), [0; UNIQUE_ID_BYTES], TIMEOUT))
        .collect();
    for (task, handle) in workers.iter().zip(handles) {
        let error = handle.join().unwrap().unwrap_err();
        assert!(check(&error), "{task}: {error}");
    }
}

#[test]
fn a_fake_leader_with_another_key_is_detected_by_every_worker() {
    let cluster = loopback_cluster(true, 3);
    let fake = spawn_keyed(&cluster, chief(), Some(wrong_key()), [9; 128], SHORT);
    workers_see_through(&cluster, |error| {
        matches!(error, ExchangeError::Unauthenticated { peer, reason, .. }
            if peer.starts_with("the leader chief:0 at 127.0.0.1:")
                && reason.contains("did not prove it knows the cluster key"))
    });
    assert!(fake.join().unwrap().is_err());
}

#[test]
fn a_fake_leader_without_a_key_is_detected_by_every_worker() {
    let cluster = loopback_cluster(true, 3);
    let fake = spawn_keyed(&cluster, chief(), None, [9; 128], SHORT);
    workers_see_through(&cluster, |error| {
        matches!(error, ExchangeError::Refused { reason, .. }
            if reason.contains("the leader has none")
                && reason.contains("before the leader proved it knows the cluster key"))
    });
    assert!(fake.join().unwrap().is_err());
}

#[test]
fn a_process_on_the_leaders_port_handing_out_ids_is_detected_by_every_worker() {
    let cluster = loopback_cluster(true, 3);
    let listener = TcpListener::bind(&cluster.tasks(TaskType::Chief)[0]).unwrap();
    // It answers every hello at once with an id of its own, in clear, as the old protocol did.
    let squatter = thread::spawn(move || {
        for _ in 0..3 {
            let (mut stream, _) = listener.accept().unwrap();
            stream.set_read_timeout(Some(TIMEOUT)).unwrap();
            // Whatever the version of the hello, the reply starts like it.
            let mut hello = [0; 60];
            assert!(stream.read(&mut hello).unwrap() >= 10);
            let mut reply = hello[..10].to_vec();
            reply.push(0);
            reply.extend_from_slice(&[9; UNIQUE_ID_BYTES]);
            stream.write_all(&reply).unwrap();
        }
    });
    workers_see_through(&cluster, |error| {
        matches!(error, ExchangeError::Unauthenticated { reason, .. }
            if reason.contains("sent an id without proving it knows the cluster key"))
    });
    squatter.join().unwrap();
}

#[test]
fn a_cluster_across_hosts_is_refused_without_a_key() {
    let cluster = ClusterSpec::new([
        (TaskType::Chief, vec![free_address()]),
        (TaskType::Worker, vec!["10.1.2.3:2222".into()]),
    ])
    .unwrap();
    for task in [chief(), worker(0)] {
        // No networking: a worker that tried would time out instead.
        let error = spawn_keyed(&cluster, task, None, the_id(), TIMEOUT)
            .join()
            .unwrap()
            .unwrap_err();
        let ExchangeError::Key(message) = &error else {
            panic!("{task}: {error}");
        };
        for expected in [
            "will not run the exchange across hosts without a cluster key",
            "worker:0 is at 10.1.2.3:2222",
            "DISTRIBUTE_CLUSTER_KEY",
            "openssl rand -hex 32",
        ] {
            assert!(message.contains(expected), "{task}: {message}");
        }
    }
}

/// Linux routes all of 127.0.0.0/8 to loopback, so 127.0.0.2 stands for another interface.
#[cfg(target_os = "linux")]
#[test]
fn a_leader_named_localhost_listens_on_loopback_only() {
    let port = free_address().rsplit_once(':').unwrap().1.to_owned();
    let cluster = ClusterSpec::new([(
        TaskType::Worker,
        vec![format!("localhost:{port}"), free_address()],
    )])
    .unwrap();
    let leader = spawn(&cluster, worker(0), TIMEOUT);
    drop(connect(&format!("127.0.0.1:{port}")));
    let elsewhere = TcpStream::connect(format!("127.0.0.2:{port}"));
    assert!(
        elsewhere.is_err(),
        "the leader took a connection on 127.0.0.2: it listens on every interface"
    );
    let other = spawn(&cluster, worker(1), TIMEOUT);
    assert_all_get_the_id(&[worker(0), worker(1)], vec![leader, other]);
}

#[test]
fn a_peer_from_another_ip_than_its_tasks_is_refused() {
    // worker:0 is said to be at 127.0.0.2, but connects from 127.0.0.1.
    let port = free_address().rsplit_once(':').unwrap().1.to_owned();
    let cluster = ClusterSpec::new([
        (TaskType::Chief, vec![free_address()]),
        (TaskType::Worker, vec![format!("127.0.0.2:{port}")]),
    ])
    .unwrap();
    let leader = spawn(&cluster, chief(), SHORT);
    let error = spawn(&cluster, worker(0), TIMEOUT)
        .join()
        .unwrap()
        .unwrap_err();
    let expected = format!(
        "it connects from 127.0.0.1, but worker:0's address in the cluster spec is \
         127.0.0.2:{port}"
    );
    assert!(
        matches!(&error, ExchangeError::Refused { reason, .. }
            if reason.starts_with(&expected)),
        "{error}"
    );
    assert!(leader.join().unwrap().is_err());
}

#[test]
fn an_endless_timeout_waits_without_limit() {
    for key in [Some(key()), None] {
        let cluster = loopback_cluster(true, 2);
        let tasks = ranks(&cluster);
        let (done, results) = mpsc::channel();
        let run = |task: TaskId| {
            let (cluster, key, done) = (cluster.clone(), key.clone(), done.clone());
            thread::spawn(move || {
                let id = nccl_rank(&cluster, task).unwrap().is_leader().then(the_id);
                let outcome = exchange(&cluster, task, id, key.as_ref(), Duration::MAX);
                done.send((task, outcome)).unwrap();
            })
        };
        // The workers wait for a leader that starts later.
        for &task in &tasks[1..] {
            run(task);
        }
        thread::sleep(Duration::from_millis(100));
        run(tasks[0]);
        for _ in &tasks {
            // A panicking task never reports: the wait ends with an error, not a hang.
            let (task, outcome) = results
                .recv_timeout(TIMEOUT)
                .expect("a task never reported");
            assert_eq!(outcome, Ok(the_id()), "{task}");
        }
    }
}

#[test]
fn without_a_key_even_a_loopback_cluster_refuses_and_says_how_to_make_one() {
    // `cargo test` gives this process no key and no opt-out (CI sets neither).
    assert!(
        std::env::var_os("DISTRIBUTE_CLUSTER_KEY").is_none()
            && std::env::var_os("DISTRIBUTE_CLUSTER_KEY_FILE").is_none()
            && std::env::var_os("DISTRIBUTE_UNAUTHENTICATED_EXCHANGE").is_none(),
        "run this test without a cluster key in the environment"
    );
    let cluster = loopback_cluster(true, 1);
    for task in [chief(), worker(0)] {
        let id = nccl_rank(&cluster, task).unwrap().is_leader().then(the_id);
        // No networking: the key is checked before any socket.
        let error = exchange_unique_id(&cluster, task, id, TIMEOUT).unwrap_err();
        let ExchangeError::Key(message) = &error else {
            panic!("{task}: {error}");
        };
        for expected in [
            "no cluster key",
            "DISTRIBUTE_CLUSTER_KEY",
            "openssl rand -hex 32",
            "DISTRIBUTE_UNAUTHENTICATED_EXCHANGE=1",
        ] {
            assert!(message.contains(expected), "{expected}: {message}");
        }
    }
}

#[test]
fn the_opt_out_runs_on_loopback_and_a_keyed_leader_refuses_its_tasks() {
    // Everyone opted out: the exchange runs (with a warning each time).
    let cluster = loopback_cluster(true, 2);
    let tasks = ranks(&cluster);
    let handles = tasks
        .iter()
        .map(|&task| spawn_keyed(&cluster, task, None, the_id(), TIMEOUT))
        .collect();
    assert_all_get_the_id(&tasks, handles);
    // A task that opted out cannot join a keyed job.
    let cluster = loopback_cluster(true, 1);
    let leader = spawn_keyed(&cluster, chief(), Some(key()), the_id(), SHORT);
    let stranger = spawn_keyed(&cluster, worker(0), None, the_id(), SHORT)
        .join()
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&stranger, ExchangeError::Refused { reason, .. }
            if reason.contains("this one has no cluster key")),
        "{stranger}"
    );
    assert!(leader.join().unwrap().is_err());
}
