//! `Checkpoints` on the default strategy: what is kept, what a damaged file does, and what a
//! checkpoint that does not fit the variables does. (Replica and worker counts are checked in
//! `distribute`'s `resume` tests.)

use std::path::PathBuf;

use distribute_input::InputPosition;
use distribute_strategy::{
    CheckpointOptions, Checkpoints, DefaultStrategy, Strategy, StrategyError, VariableOptions,
};
use distribute_tensor::{DType, Tensor};
use distribute_values::{DistributedVariable, Leaf, UpdateOp};

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "distribute-strategy-ckpt-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn variables(
    strategy: &DefaultStrategy,
) -> (DistributedVariable<Tensor>, DistributedVariable<f64>) {
    let w = Tensor::zeros("/cpu:0", DType::F32, &[3]).unwrap();
    (
        strategy
            .create_variable("w", w, VariableOptions::default())
            .unwrap(),
        strategy
            .create_variable("count", 0.0, VariableOptions::default())
            .unwrap(),
    )
}

/// Saves after each of `steps` steps, `count` being the step and `w` filled with it.
fn train(dir: &PathBuf, steps: u64) -> Checkpoints {
    let checkpoints = Checkpoints::new(dir, CheckpointOptions { every: 5, keep: 3 }).unwrap();
    let strategy = DefaultStrategy::new().unwrap();
    let (w, count) = variables(&strategy);
    let cross = strategy.cross_replica();
    for step in 1..=steps {
        let filled = Tensor::from_vec("/cpu:0", &[3], vec![step as f32; 3]).unwrap();
        cross
            .update(&w, UpdateOp::Assign, &Leaf::Same(filled))
            .unwrap();
        cross
            .update(&count, UpdateOp::AssignAdd, &Leaf::Same(1.0))
            .unwrap();
        checkpoints
            .save(&strategy, step, &[&w, &count], InputPosition::at_step(step))
            .unwrap();
    }
    checkpoints
}

/// Restores into fresh variables: the resume and the restored `count`.
fn restore(checkpoints: &Checkpoints) -> Result<Option<(u64, f64, Vec<PathBuf>)>, StrategyError> {
    let strategy = DefaultStrategy::new().unwrap();
    let (w, count) = variables(&strategy);
    let Some(resume) = checkpoints.restore(&strategy, &[&w, &count])? else {
        return Ok(None);
    };
    let cross = strategy.cross_replica();
    let count = cross.read_var(&count)?;
    assert_eq!(cross.read_var(&w)?.to_vec::<f32>()?, vec![count as f32; 3]);
    assert_eq!(resume.input, InputPosition::at_step(resume.step));
    let refused = resume.refused.into_iter().map(|(p, _)| p).collect();
    Ok(Some((resume.step, count, refused)))
}

#[test]
fn the_newest_checkpoints_are_kept_and_the_newest_restores() {
    let dir = fresh_dir("keep");
    // What a chief killed while writing leaves: deleted by the next save.
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ckpt-0000000003.dst.tmp"), b"torn").unwrap();
    let checkpoints = train(&dir, 23);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "ckpt-0000000010.dst",
            "ckpt-0000000015.dst",
            "ckpt-0000000020.dst"
        ]
    );
    assert_eq!(restore(&checkpoints).unwrap(), Some((20, 20.0, vec![])));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_directory_is_a_fresh_start() {
    let checkpoints = Checkpoints::new(fresh_dir("none"), CheckpointOptions::default()).unwrap();
    assert_eq!(restore(&checkpoints).unwrap(), None);
}

#[test]
fn a_damaged_checkpoint_is_refused_and_the_previous_one_restores() {
    type Damage = fn(&mut Vec<u8>);
    let damages: [(&str, Damage); 6] = [
        ("truncated", |b| b.truncate(b.len() - 1)),
        ("torn header", |b| b.truncate(20)),
        ("a payload byte flipped", |b| *b.last_mut().unwrap() ^= 1),
        ("a header byte flipped", |b| b[13] ^= 0x40),
        ("a checksum byte flipped", |b| b[30] ^= 0x01),
        (
            "format version 1 (a SHA-256 where 2 has its checksum)",
            |b| b[8] = 1,
        ),
    ];
    for (what, damage) in damages {
        let dir = fresh_dir("damaged");
        let checkpoints = train(&dir, 20);
        let newest = checkpoints.path_of(20);
        let mut bytes = std::fs::read(&newest).unwrap();
        damage(&mut bytes);
        std::fs::write(&newest, bytes).unwrap();
        assert_eq!(
            restore(&checkpoints).unwrap(),
            Some((15, 15.0, vec![newest.clone()])),
            "{what}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_checkpoint_that_does_not_fit_the_variables_is_an_error_naming_it() {
    let dir = fresh_dir("misfit");
    let checkpoints = train(&dir, 5);
    let strategy = DefaultStrategy::new().unwrap();
    let other_shape = Tensor::zeros("/cpu:0", DType::F32, &[4]).unwrap();
    let w = strategy
        .create_variable("w", other_shape, VariableOptions::default())
        .unwrap();
    let err = checkpoints
        .restore(&strategy, &[&w])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ckpt-0000000005.dst") && err.contains("variable w"),
        "{err}"
    );

    let missing = strategy
        .create_variable("bias", 0.0f64, VariableOptions::default())
        .unwrap();
    let err = checkpoints
        .restore(&strategy, &[&missing])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ckpt-0000000005.dst") && err.contains("no variable bias"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn options_of_zero_are_refused() {
    for options in [
        CheckpointOptions { every: 0, keep: 1 },
        CheckpointOptions { every: 1, keep: 0 },
    ] {
        assert!(Checkpoints::new("unused", options).is_err());
    }
}
