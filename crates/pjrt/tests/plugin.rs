//! Behaviour of the binding on a real plugin: the one `PJRT_PLUGIN` names, else the pinned CPU
//! plugin `cargo xtask fetch-pjrt` installs (`cargo xtask test` does so first). Without one these
//! tests fail with the error that says how to get it. Checks of what only the CPU plugin does
//! (its platform name, its device count option) run on the pinned CPU plugin only.
//!
//! Tests run on the devices the plugin offers ([`Plugin::offer`]; one GPU gives one): a test
//! generic over the replica count runs over the counts it can give, and a test that needs more
//! prints `skipped: needs N devices, the <platform> plugin has M` and returns before it creates a
//! client. `DISTRIBUTE_PJRT_DEVICES=1` makes the CPU plugin such a one-device plugin.

use distribute_pjrt::stablehlo::{
    AllReduceOp, Builder, Comparison, DotDims, Reduction, ReplicaGroups, TensorType, UnaryOp, Value,
};
use distribute_pjrt::{
    CPU_PLATFORM, Client, ClientOptions, CompileOptions, ElementType, ErrorCode, Offer, Plugin,
    Shortfall, pinned_plugin_path,
};

mod common;

fn plugin() -> &'static Plugin {
    Plugin::discover().unwrap_or_else(|err| panic!("{err}"))
}

fn offer() -> &'static Offer {
    plugin().offer().unwrap_or_else(|err| panic!("{err}"))
}

/// A client of the plugin with `devices` devices: exactly that many on the CPU plugin, the first
/// of them on any other (which must have enough).
fn client(devices: usize) -> Client {
    Client::with_devices(plugin(), &ClientOptions::default(), Some(devices))
        .unwrap_or_else(|err| panic!("{err}"))
        .0
}

/// Prints why the running test skips (some of) its work.
fn skip(reason: &dyn std::fmt::Display) {
    let test = std::thread::current().name().unwrap_or("").to_owned();
    println!("skipped: {reason} ({test})");
}

/// A client with `devices` devices, or `None` after saying why not: the plugin offers fewer.
fn client_or_skip(devices: usize) -> Option<Client> {
    match offer().check(devices) {
        Ok(()) => Some(client(devices)),
        Err(short) => {
            skip(&short);
            None
        }
    }
}

/// The replica counts of `counts` the plugin can give; the others are skipped, each with its
/// reason.
fn counts(counts: &[usize]) -> Vec<usize> {
    let (within, short) = offer().counts_within(counts);
    short.iter().for_each(|s: &Shortfall| skip(s));
    within
}

/// Whether the plugin is the pinned CPU plugin, whose own behaviour some tests check.
fn is_the_pinned_cpu_plugin() -> bool {
    pinned_plugin_path()
        .canonicalize()
        .is_ok_and(|pinned| plugin().path() == pinned)
}

fn f32s(dims: &[i64]) -> TensorType {
    TensorType::new(ElementType::F32, dims)
}

/// Runs a program taking one `[len]` f32 input per replica (replica r gets `inputs[r]`) and
/// returns every replica's first output.
fn run_replicated(
    client: &Client,
    replicas: usize,
    len: i64,
    inputs: &[Vec<f32>],
    program: impl FnOnce(&mut Builder, &Value) -> Value,
) -> Vec<Vec<f32>> {
    let mut b = Builder::new();
    let x = b.parameter(f32s(&[len]));
    let out = program(&mut b, &x);
    let module = b.build("test", &[out], replicas as u32).unwrap();
    let executable = client
        .compile(module.text(), &module.compile_options())
        .unwrap_or_else(|err| panic!("{err}\n{}", module.text()));
    assert_eq!(executable.num_replicas(), replicas);
    let devices = client.devices().unwrap();
    let buffers: Vec<_> = inputs
        .iter()
        .zip(&devices)
        .map(|(data, device)| client.buffer_from_host(data, &[len], device).unwrap())
        .collect();
    let args: Vec<Vec<_>> = buffers.iter().map(|b| vec![b]).collect();
    let outputs = executable.execute(&args).unwrap().wait().unwrap();
    outputs
        .iter()
        .map(|o| o[0].to_vec::<f32>().unwrap())
        .collect()
}

#[test]
fn the_plugin_reports_its_version_and_devices() {
    let client = client(1);
    let (major, minor) = client.plugin().version();
    assert_eq!(major, 0);
    assert!(minor >= 90, "minor {minor}");
    assert_eq!(client.platform_name().unwrap(), offer().platform());
    assert_eq!(client.devices().unwrap().len(), 1);
    if !is_the_pinned_cpu_plugin() {
        skip(&format!(
            "the pinned CPU plugin's platform and device kinds, on {}",
            plugin().path().display()
        ));
        return;
    }
    assert_eq!(client.platform_name().unwrap(), "cpu");
    let Some(client) = client_or_skip(4) else {
        return;
    };
    let devices = client.devices().unwrap();
    assert_eq!(devices.len(), 4);
    let ids: Vec<i32> = devices.iter().map(|d| d.id()).collect();
    assert_eq!(ids, [0, 1, 2, 3]);
    assert!(devices.iter().all(|d| d.kind() == "cpu"), "{devices:?}");
}

#[test]
fn buffers_round_trip_with_their_type_and_shape() {
    let client = client(1);
    let device = &client.devices().unwrap()[0];
    let data: Vec<i64> = (0..6).collect();
    let buffer = client.buffer_from_host(&data, &[2, 3], device).unwrap();
    assert_eq!(buffer.element_type().unwrap(), ElementType::S64);
    assert_eq!(buffer.dims().unwrap(), [2, 3]);
    assert_eq!(buffer.to_vec::<i64>().unwrap(), data);
    let err = buffer.to_vec::<f32>().unwrap_err().to_string();
    assert!(err.contains("element type mismatch"), "{err}");
    let err = client
        .buffer_from_host(&data, &[4], device)
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds 4 elements, the host slice 6"), "{err}");
}

/// Several threads reading one buffer at once (a `Buffer` is `Sync`) all get its values: the
/// in-place read's bookkeeping in the plugin is per buffer and unlocked, so the binding takes
/// turns.
#[test]
fn threads_reading_one_buffer_at_once_all_get_its_values() {
    let client = client(1);
    let device = &client.devices().unwrap()[0];
    let data: Vec<f64> = (0..1000).map(|i| f64::from(i) * 0.25).collect();
    let buffer = client.buffer_from_host(&data, &[10, 100], device).unwrap();
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..300 {
                    assert_eq!(buffer.to_vec::<f64>().unwrap(), data);
                }
            });
        }
    });
}

#[test]
fn all_reduce_ops_on_1_2_4_and_8_replicas() {
    for replicas in counts(&[1, 2, 4, 8]) {
        let client = client(replicas);
        // Replica r holds [r + 1, -(r + 1), 10 r].
        let inputs: Vec<Vec<f32>> = (0..replicas)
            .map(|r| {
                let r = r as f32;
                vec![r + 1.0, -(r + 1.0), 10.0 * r]
            })
            .collect();
        let n = replicas as f32;
        let column = |i: usize| inputs.iter().map(move |v| v[i]);
        let expected = |op: AllReduceOp| -> Vec<f32> {
            (0..3)
                .map(|i| match op {
                    AllReduceOp::Sum => column(i).sum(),
                    AllReduceOp::Mean => column(i).sum::<f32>() / n,
                    AllReduceOp::Min => column(i).fold(f32::INFINITY, f32::min),
                    AllReduceOp::Max => column(i).fold(f32::NEG_INFINITY, f32::max),
                })
                .collect()
        };
        for op in [
            AllReduceOp::Sum,
            AllReduceOp::Mean,
            AllReduceOp::Min,
            AllReduceOp::Max,
        ] {
            let outputs = run_replicated(&client, replicas, 3, &inputs, |b, x| {
                b.all_reduce(x, op, &ReplicaGroups::all(replicas as u32))
                    .unwrap()
            });
            for (r, out) in outputs.iter().enumerate() {
                assert_eq!(
                    out,
                    &expected(op),
                    "{op:?}, {replicas} replicas, replica {r}"
                );
            }
        }
    }
}

#[test]
fn all_reduce_within_replica_groups() {
    let Some(client) = client_or_skip(4) else {
        return;
    };
    let inputs: Vec<Vec<f32>> = (0..4).map(|r| vec![1.0 + r as f32]).collect();
    let groups = ReplicaGroups::new(vec![vec![0, 2], vec![1, 3]]).unwrap();
    let outputs = run_replicated(&client, 4, 1, &inputs, |b, x| {
        b.all_reduce(x, AllReduceOp::Sum, &groups).unwrap()
    });
    assert_eq!(outputs, [[4.0], [6.0], [4.0], [6.0]]);
}

#[test]
fn replica_id_is_each_replicas_index() {
    for replicas in counts(&[1, 2, 4, 8]) {
        let client = client(replicas);
        let inputs = vec![vec![0.0f32]; replicas];
        let outputs = run_replicated(&client, replicas, 1, &inputs, |b, x| {
            let id = b.replica_id();
            let id = b.convert(&id, ElementType::F32);
            let id = b.reshape(&id, &[1]).unwrap();
            b.add(x, &id).unwrap()
        });
        let expected: Vec<Vec<f32>> = (0..replicas).map(|r| vec![r as f32]).collect();
        assert_eq!(outputs, expected, "{replicas} replicas");
    }
}

#[test]
fn all_gather_and_all_to_all_move_blocks_between_replicas() {
    let Some(client) = client_or_skip(2) else {
        return;
    };
    let inputs = vec![vec![1.0f32, 2.0], vec![3.0, 4.0]];
    let gathered = run_replicated(&client, 2, 2, &inputs, |b, x| {
        b.all_gather(x, 0, &ReplicaGroups::all(2)).unwrap()
    });
    assert_eq!(gathered, [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]]);
    // Block i of every replica goes to replica i.
    let exchanged = run_replicated(&client, 2, 2, &inputs, |b, x| {
        b.all_to_all(x, 0, 0, &ReplicaGroups::all(2)).unwrap()
    });
    assert_eq!(exchanged, [[1.0, 3.0], [2.0, 4.0]]);
}

/// One program using the single-replica ops a training step needs, checked against the same
/// arithmetic on the host.
#[test]
fn dense_ops_compute_what_the_host_computes() {
    let client = client(1);
    let mut b = Builder::new();
    let x = b.parameter(f32s(&[2, 3]));
    let w = b.parameter(f32s(&[3]));
    let xw = b.matmul(&x, &w).unwrap(); // [2]
    let xt = b.transpose(&x, &[1, 0]).unwrap(); // [3, 2]
    let batch = b
        .dot_general(
            &x,
            &xt,
            &DotDims {
                lhs_contracting: vec![1],
                rhs_contracting: vec![0],
                ..DotDims::default()
            },
        )
        .unwrap(); // [2, 2] = x xᵀ
    let zero = b.scalar(0.0f32);
    let trace_like = b.reduce(&batch, &zero, &[0, 1], Reduction::Sum).unwrap(); // scalar
    let big = b.scalar(f32::NEG_INFINITY);
    let row_max = b.reduce(&x, &big, &[1], Reduction::Max).unwrap(); // [2]
    let half = b.splat(0.5f32, &[2]);
    let gt = b.compare(Comparison::Gt, &xw, &half).unwrap();
    let neg = b.unary(UnaryOp::Negate, &xw);
    let picked = b.select(&gt, &xw, &neg).unwrap();
    let w_rows = b.broadcast_in_dim(&w, &[2, 3], &[1]).unwrap();
    let scaled = b.multiply(&x, &w_rows).unwrap();
    let flat = b.reshape(&scaled, &[6]).unwrap();
    let module = b
        .build("dense", &[picked, trace_like, row_max, flat], 1)
        .unwrap();
    let exe = client
        .compile(module.text(), &CompileOptions::replicated(1))
        .unwrap_or_else(|err| panic!("{err}\n{}", module.text()));
    assert_eq!(exe.num_outputs(), 4);
    let device = &client.devices().unwrap()[0];
    let xs = [1.0f32, -2.0, 3.0, 0.5, 0.25, -1.0];
    let ws = [0.5f32, 1.0, -0.25];
    let xb = client.buffer_from_host(&xs, &[2, 3], device).unwrap();
    let wb = client.buffer_from_host(&ws, &[3], device).unwrap();
    let out = exe.execute(&[vec![&xb, &wb]]).unwrap().wait().unwrap();
    let row = |r: usize| &xs[3 * r..3 * r + 3];
    let dot = |a: &[f32], c: &[f32]| a.iter().zip(c).map(|(a, c)| a * c).sum::<f32>();
    let xw: Vec<f32> = (0..2).map(|r| dot(row(r), &ws)).collect();
    let picked: Vec<f32> = xw.iter().map(|&v| if v > 0.5 { v } else { -v }).collect();
    let gram: f32 = (0..2)
        .flat_map(|i| (0..2).map(move |j| (i, j)))
        .map(|(i, j)| dot(row(i), row(j)))
        .sum();
    let row_max: Vec<f32> = (0..2)
        .map(|r| row(r).iter().copied().fold(f32::NEG_INFINITY, f32::max))
        .collect();
    let flat: Vec<f32> = xs.iter().enumerate().map(|(i, v)| v * ws[i % 3]).collect();
    assert_eq!(out[0][0].to_vec::<f32>().unwrap(), picked);
    assert!((out[0][1].to_vec::<f32>().unwrap()[0] - gram).abs() < 1e-5);
    assert_eq!(out[0][2].to_vec::<f32>().unwrap(), row_max);
    assert_eq!(out[0][3].to_vec::<f32>().unwrap(), flat);
}

#[test]
fn dynamic_slice_reads_the_row_a_loop_counter_selects() {
    let client = client(1);
    let mut b = Builder::new();
    let x = b.parameter(f32s(&[3, 2]));
    let i = b.parameter(TensorType::scalar(ElementType::S32));
    let zero = b.scalar(0i32);
    let row = b.dynamic_slice(&x, &[&i, &zero], &[1, 2]).unwrap();
    let module = b.build("slice", &[row], 1).unwrap();
    let exe = client
        .compile(module.text(), &module.compile_options())
        .unwrap_or_else(|err| panic!("{err}\n{}", module.text()));
    let device = &client.devices().unwrap()[0];
    let xb = client
        .buffer_from_host(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2], device)
        .unwrap();
    for (index, expected) in [(0i32, [1.0f32, 2.0]), (2, [5.0, 6.0]), (7, [5.0, 6.0])] {
        let ib = client.buffer_from_host(&[index], &[], device).unwrap();
        let out = exe.execute(&[vec![&xb, &ib]]).unwrap().wait().unwrap();
        assert_eq!(
            out[0][0].to_vec::<f32>().unwrap(),
            expected,
            "row {index} (clamped)"
        );
    }
}

#[test]
fn a_while_loop_with_a_cross_replica_sum_in_its_body() {
    for replicas in counts(&[1, 4]) {
        while_loop_then_a_sum_on(replicas);
    }
}

fn while_loop_then_a_sum_on(replicas: usize) {
    // TPU-27's shape: 10 iterations adding 1 per replica, then a sum over replicas.
    let client = client(replicas);
    let mut b = Builder::new();
    let x = b.parameter(f32s(&[]));
    let i0 = b.scalar(0i32);
    let out = b
        .while_loop(
            &[&i0, &x],
            |b, args| {
                let ten = b.scalar(10i32);
                b.compare(Comparison::Lt, &args[0], &ten)
            },
            |b, args| {
                let one = b.scalar(1i32);
                let onef = b.scalar(1.0f32);
                Ok(vec![b.add(&args[0], &one)?, b.add(&args[1], &onef)?])
            },
        )
        .unwrap();
    let total = b
        .all_reduce(
            &out[1],
            AllReduceOp::Sum,
            &ReplicaGroups::all(replicas as u32),
        )
        .unwrap();
    let module = b
        .build("loop", &[total, out[0].clone()], replicas as u32)
        .unwrap();
    let exe = client
        .compile(module.text(), &module.compile_options())
        .unwrap_or_else(|err| panic!("{err}\n{}", module.text()));
    let devices = client.devices().unwrap();
    let zeros: Vec<_> = devices
        .iter()
        .map(|d| client.buffer_from_host(&[0.0f32], &[], d).unwrap())
        .collect();
    let args: Vec<Vec<_>> = zeros.iter().map(|b| vec![b]).collect();
    let outputs = exe.execute(&args).unwrap().wait().unwrap();
    assert_eq!(outputs.len(), replicas);
    for replica in &outputs {
        assert_eq!(
            replica[0].to_vec::<f32>().unwrap(),
            [10.0 * replicas as f32]
        );
        assert_eq!(replica[1].to_vec::<i32>().unwrap(), [10]);
    }
}

#[test]
fn bad_stablehlo_returns_the_compilers_message() {
    let client = client(1);
    let err = client
        .compile(
            "module { func.func @main() -> tensor<f32> { %0 = \"stablehlo.bogus\"() : () -> tensor<f32>\n func.return %0 : tensor<f32> } }",
            &CompileOptions::replicated(1),
        )
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("PJRT_Client_Compile failed"), "{text}");
    assert!(
        text.contains("unregistered operation 'stablehlo.bogus'"),
        "the compiler's own message: {text}"
    );
    assert!(err.code().is_some_and(|c| c != ErrorCode(0)), "{text}");
}

#[test]
fn wrong_argument_lists_are_refused_before_the_plugin_sees_them() {
    let Some(client) = client_or_skip(2) else {
        return;
    };
    let mut b = Builder::new();
    let x = b.parameter(f32s(&[1]));
    let module = b.build("id", &[x], 2).unwrap();
    let exe = client
        .compile(module.text(), &module.compile_options())
        .unwrap();
    let devices = client.devices().unwrap();
    let a = client
        .buffer_from_host(&[1.0f32], &[1], &devices[0])
        .unwrap();
    let err = exe.execute(&[vec![&a]]).unwrap_err().to_string();
    assert!(
        err.contains("runs on 2 replicas but got 1 argument lists"),
        "{err}"
    );
    let err = exe.execute(&[vec![&a], vec![]]).unwrap_err().to_string();
    assert!(err.contains("replica 1 got 0 arguments"), "{err}");
}

/// 64 and 1000 were accepted, and XLA aborted the process 40 s into a run; the client refuses
/// them before the plugin is asked for anything.
#[test]
fn max_in_flight_above_the_safe_depth_is_refused() {
    let plugin = Plugin::discover().unwrap_or_else(|err| panic!("{err}"));
    for depth in [distribute_pjrt::MAX_IN_FLIGHT + 1, 64, 1000] {
        let options = ClientOptions {
            max_in_flight: depth,
            ..ClientOptions::cpu(2)
        };
        let err = Client::new(plugin, &options).unwrap_err();
        assert!(err.to_string().contains("outside 1..=32"), "{depth}: {err}");
    }
}

/// JAX 0.10 deadlocks past ~32 pmap calls with a psum in flight; here 200 chained executions are
/// issued without waiting, each consuming the previous one's output, and all must complete.
#[test]
fn two_hundred_executions_in_flight_complete() {
    for replicas in counts(&[1, 4, 8]) {
        two_hundred_executions_on(replicas);
    }
}

fn two_hundred_executions_on(replicas: usize) {
    const STEPS: usize = 200;
    let client = client(replicas);
    let mut b = Builder::new();
    let x = b.parameter(f32s(&[2]));
    let id = b.replica_id();
    let id = b.convert(&id, ElementType::F32);
    let id = b.broadcast_in_dim(&id, &[2], &[]).unwrap();
    let one = b.splat(1.0f32, &[2]);
    let contribution = b.add(&id, &one).unwrap(); // replica r adds r + 1
    let total = b
        .all_reduce(
            &contribution,
            AllReduceOp::Sum,
            &ReplicaGroups::all(replicas as u32),
        )
        .unwrap();
    let next = b.add(&x, &total).unwrap();
    let module = b.build("step", &[next], replicas as u32).unwrap();
    let exe = client
        .compile(module.text(), &module.compile_options())
        .unwrap();
    let devices = client.devices().unwrap();
    let initial: Vec<_> = devices
        .iter()
        .map(|d| client.buffer_from_host(&[0.0f32, 1.0], &[2], d).unwrap())
        .collect();
    let mut in_flight = Vec::with_capacity(STEPS);
    let first = exe
        .execute(&initial.iter().map(|b| vec![b]).collect::<Vec<_>>())
        .unwrap();
    in_flight.push(first);
    for _ in 1..STEPS {
        let previous = in_flight.last().unwrap();
        let args: Vec<Vec<_>> = previous.outputs().iter().map(|o| vec![&o[0]]).collect();
        let next = exe.execute(&args).unwrap();
        in_flight.push(next);
    }
    let last = in_flight.pop().unwrap().wait().unwrap();
    for execution in in_flight {
        execution.wait().unwrap();
    }
    // Each step adds 1 + 2 + … + replicas.
    let per_step = (replicas * (replicas + 1) / 2 * STEPS) as f32;
    for replica in &last {
        assert_eq!(
            replica[0].to_vec::<f32>().unwrap(),
            [per_step, 1.0 + per_step]
        );
    }
}

#[test]
fn a_device_assignment_places_replicas_on_chosen_devices() {
    let Some(client) = client_or_skip(4) else {
        return;
    };
    let mut b = Builder::new();
    let x = b.parameter(f32s(&[1]));
    let id = b.replica_id();
    let id = b.convert(&id, ElementType::F32);
    let id = b.reshape(&id, &[1]).unwrap();
    let y = b.add(&x, &id).unwrap();
    let sum = b
        .all_reduce(&y, AllReduceOp::Sum, &ReplicaGroups::all(2))
        .unwrap();
    let module = b.build("placed", &[y, sum], 2).unwrap();
    let options = CompileOptions {
        device_assignment: Some(vec![3, 1]),
        ..CompileOptions::replicated(2)
    };
    let exe = client.compile(module.text(), &options).unwrap();
    let devices = client.devices().unwrap();
    let on = |device: usize, v: f32| {
        client
            .buffer_from_host(&[v], &[1], &devices[device])
            .unwrap()
    };
    let (a, c) = (on(3, 10.0), on(1, 20.0));
    let out = exe.execute(&[vec![&a], vec![&c]]).unwrap().wait().unwrap();
    assert_eq!(out[0][0].to_vec::<f32>().unwrap(), [10.0]);
    assert_eq!(out[1][0].to_vec::<f32>().unwrap(), [21.0]);
    assert_eq!(out[0][1].to_vec::<f32>().unwrap(), [31.0]);
    // Inputs on the default devices (0, 1) do not match the assignment.
    let (d0, d1) = (on(0, 1.0), on(1, 2.0));
    let err = exe
        .execute(&[vec![&d0], vec![&d1]])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("argument 0 of replica 0 is on another device"),
        "refused before any replica starts (a partial launch would hang): {err}"
    );
}

#[test]
fn with_devices_gives_all_or_the_first_n_and_names_both_counts_when_short() {
    let plugin = plugin();
    let (client, devices) = Client::with_devices(plugin, &ClientOptions::default(), None).unwrap();
    assert_eq!(devices.len(), client.devices().unwrap().len());
    let err = Client::with_devices(plugin, &ClientOptions::default(), Some(0)).unwrap_err();
    assert!(err.to_string().contains("asked for 0 devices"), "{err}");
    if let Some(most) = offer().most_devices() {
        // A plugin of fixed devices (or a capped CPU plugin): all of them, and no more.
        assert_eq!(devices.len(), most);
        common::one_more_device_is_refused(plugin, most);
        return;
    }
    assert_eq!(offer().platform(), CPU_PLATFORM);
    // The CPU plugin is created with exactly the devices asked for, more than its default too.
    for n in [1, 3, 6] {
        let (client, devices) =
            Client::with_devices(plugin, &ClientOptions::default(), Some(n)).unwrap();
        assert_eq!(devices.len(), n);
        assert_eq!(client.devices().unwrap().len(), n);
    }
    // An explicit device count is kept, so asking for more than it gives is refused.
    let err = Client::with_devices(plugin, &ClientOptions::cpu(2), Some(3))
        .unwrap_err()
        .to_string();
    assert!(err.contains("asked for 3 devices"), "{err}");
    assert!(err.contains("has 2"), "{err}");
    let (_, devices) = Client::with_devices(plugin, &ClientOptions::cpu(4), Some(2)).unwrap();
    assert_eq!(devices.iter().map(|d| d.id()).collect::<Vec<_>>(), [0, 1]);
}
