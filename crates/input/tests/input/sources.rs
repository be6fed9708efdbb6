//! Real sources (.npy and CSV files) and the errors bad input gives: each names the file or
//! element at fault, and nothing panics.

use std::collections::BTreeMap;
use std::path::PathBuf;

use distribute_input::{
    CsvOptions, CsvSource, Dataset, DistributedDataset, ErrorKind, InputError, InputOptions,
    NpySource, npy,
};
use distribute_tensor::{DType, Tensor};
use distribute_values::DistributedValues;

use crate::common::local;

fn write(dir: &tempfile::TempDir, name: &str, text: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn first_error<B: distribute_input::Batch>(ds: &Dataset<B>) -> InputError {
    ds.iter().find_map(Result::err).expect("an error")
}

#[test]
fn npy_round_trips_every_supported_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = [
        Tensor::from_vec("/cpu:0", &[2, 3], vec![1.5f32, -2.0, 3.0, 4.0, 5.0, 6.0]).unwrap(),
        Tensor::from_vec("/cpu:0", &[3], vec![1.0f64, 2.0, f64::MAX]).unwrap(),
        Tensor::from_vec("/cpu:0", &[1, 1, 2], vec![i32::MIN, 7]).unwrap(),
        Tensor::from_vec("/cpu:0", &[0, 4], Vec::<i64>::new()).unwrap(),
    ];
    for (i, t) in tensors.iter().enumerate() {
        let path = dir.path().join(format!("{i}.npy"));
        npy::write(&path, t).unwrap();
        let back = npy::read(&path).unwrap();
        assert!(back.bitwise_eq(t), "{t} != {back}");
    }
    let half = Tensor::zeros("/cpu:0", DType::F16, &[2]).unwrap();
    assert!(npy::write(&dir.path().join("h.npy"), &half).is_err());
}

#[test]
fn npy_files_batch_across_file_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = (0..3)
        .map(|f| {
            let path = dir.path().join(format!("{f}.npy"));
            let rows: Vec<f32> = (0..6).map(|i| (f * 3 + i / 2) as f32).collect();
            npy::write(&path, &Tensor::from_vec("/cpu:0", &[3, 2], rows).unwrap()).unwrap();
            path
        })
        .collect();
    let ds = Dataset::from_source(NpySource::new(&files).unwrap())
        .batch(4, false)
        .unwrap();
    let batches: Vec<Tensor> = ds.iter().collect::<Result<_, _>>().unwrap();
    assert_eq!(
        batches.iter().map(|b| b.shape()[0]).collect::<Vec<_>>(),
        [4, 4, 1]
    );
    assert_eq!(
        batches[1].to_vec::<f32>().unwrap(),
        [4.0, 4.0, 5.0, 5.0, 6.0, 6.0, 7.0, 7.0]
    );
}

#[test]
fn csv_files_read_as_the_chosen_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(&dir, "a.csv", b"x;y\n1; 2\n3;4\n");
    let b = write(&dir, "b.csv", b"x;y\n5;6\n");
    let options = CsvOptions {
        delimiter: b';',
        dtype: DType::I64,
        ..CsvOptions::default()
    };
    let ds = Dataset::from_source(CsvSource::new([&a, &b], options).unwrap())
        .batch(2, false)
        .unwrap();
    let dist = DistributedDataset::new(ds, &local(2), InputOptions::default()).unwrap();
    let step: Vec<Vec<i64>> = dist
        .iter_per_replica()
        .nth(1)
        .unwrap()
        .unwrap()
        .values()
        .iter()
        .map(|t| t.to_vec::<i64>().unwrap())
        .collect();
    assert_eq!(step, [vec![5, 6], vec![]]);
    let no_header = write(&dir, "c.csv", b"0.5,1.5\n");
    let ds = Dataset::from_source(
        CsvSource::new(
            [&no_header],
            CsvOptions {
                has_header: false,
                dtype: DType::F64,
                ..CsvOptions::default()
            },
        )
        .unwrap(),
    );
    assert_eq!(
        ds.iter().next().unwrap().unwrap().to_vec::<f64>().unwrap(),
        [0.5, 1.5]
    );
}

#[test]
fn bad_files_name_the_file_and_place() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.npy");
    let not_npy = write(&dir, "text.npy", b"hello, world");
    let ragged_csv = write(&dir, "ragged.csv", b"a,b\n1,2\n3\n");
    let ragged_headerless = write(&dir, "headerless.csv", b"1,2\n3,4\n5\n");
    let bad_number = write(&dir, "number.csv", b"a,b\n1,2\n3,x7\n");
    let scalar = dir.path().join("scalar.npy");
    npy::write(&scalar, &Tensor::scalar("/cpu:0", 1.0f32)).unwrap();
    let wide = dir.path().join("wide.npy");
    npy::write(
        &wide,
        &Tensor::from_vec("/cpu:0", &[1, 3], vec![1.0f32; 3]).unwrap(),
    )
    .unwrap();
    let narrow = dir.path().join("narrow.npy");
    npy::write(
        &narrow,
        &Tensor::from_vec("/cpu:0", &[1, 2], vec![1.0f32; 2]).unwrap(),
    )
    .unwrap();

    let npy_ds = |files: &[&PathBuf]| {
        Dataset::from_source(NpySource::new(files).unwrap())
            .batch(2, false)
            .unwrap()
    };
    let csv_ds = |file: &PathBuf| {
        Dataset::from_source(CsvSource::new([file], CsvOptions::default()).unwrap())
            .batch(2, false)
            .unwrap()
    };

    let cases: Vec<(InputError, &str, ErrorKind)> = vec![
        (
            first_error(&npy_ds(&[&missing])),
            "missing.npy",
            ErrorKind::DataLoss,
        ),
        (
            first_error(&npy_ds(&[&not_npy])),
            "text.npy': not a supported .npy file: the file does not start",
            ErrorKind::DataLoss,
        ),
        (
            first_error(&npy_ds(&[&scalar])),
            "scalar.npy': element the top level is rank 0",
            ErrorKind::InvalidArgument,
        ),
        (
            first_error(&npy_ds(&[&wide, &narrow])),
            "consecutive blocks cannot form one batch",
            ErrorKind::InvalidArgument,
        ),
        (
            first_error(&csv_ds(&ragged_csv)),
            "ragged.csv' line 3: 1 fields where earlier records have 2",
            ErrorKind::DataLoss,
        ),
        (
            // Without a header the first record sets the width.
            first_error(
                &Dataset::from_source(
                    CsvSource::new(
                        [&ragged_headerless],
                        CsvOptions {
                            has_header: false,
                            ..CsvOptions::default()
                        },
                    )
                    .unwrap(),
                )
                .batch(2, false)
                .unwrap(),
            ),
            "headerless.csv' line 3: 1 fields where earlier records have 2",
            ErrorKind::DataLoss,
        ),
        (
            first_error(&csv_ds(&bad_number)),
            "number.csv' line 3: column 2: 'x7' is not a valid float32 number",
            ErrorKind::DataLoss,
        ),
    ];
    for (err, expected, kind) in cases {
        assert!(
            err.to_string().contains(expected),
            "{expected:?} not in {err}"
        );
        assert_eq!(err.kind(), kind, "{err}");
    }
}

#[test]
fn ragged_and_rank_zero_memory_data_are_refused_with_the_element_named() {
    let x = Tensor::from_vec("/cpu:0", &[4], vec![0i64; 4]).unwrap();
    let y = Tensor::from_vec("/cpu:0", &[3], vec![0i64; 3]).unwrap();
    let err = Dataset::from_tensors(BTreeMap::from([
        ("x".to_owned(), x.clone()),
        ("y".to_owned(), y),
    ]))
    .unwrap_err();
    assert!(err.to_string().contains(r#"["x"]: 4, ["y"]: 3"#), "{err}");
    let err = Dataset::from_tensors(vec![x, Tensor::scalar("/cpu:0", 1i64)]).unwrap_err();
    assert!(err.to_string().contains("element [1] is rank 0"), "{err}");
}

#[test]
fn errors_reach_the_distributed_iterator_and_end_it() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.npy");
    npy::write(
        &good,
        &Tensor::from_vec("/cpu:0", &[4], vec![1i64; 4]).unwrap(),
    )
    .unwrap();
    let bad = write(&dir, "bad.npy", b"\x93NUMPY\x03\x00\x00\x00");
    for prefetch in [0, 2] {
        let ds = Dataset::from_source(NpySource::new([&good, &bad]).unwrap())
            .batch(4, false)
            .unwrap();
        let dist = DistributedDataset::new(
            ds,
            &local(2),
            InputOptions {
                prefetch,
                ..InputOptions::default()
            },
        )
        .unwrap();
        let items: Vec<_> = dist.iter_per_replica().collect();
        assert_eq!(
            items.len(),
            2,
            "one good step, then the error, then the end"
        );
        assert!(items[0].is_ok());
        let err = items[1].as_ref().unwrap_err().to_string();
        assert!(
            err.contains("bad.npy") && err.contains("format version 3.0"),
            "{err}"
        );
    }
}

#[test]
fn empty_batches_do_not_keep_a_source_block_alive() {
    // Blocks [0, 1], [2, 3], [4] batched by 2 over 2 replicas: replica 1 gets an empty batch
    // on the last step, made from a 0-row batch of the data's structure. That batch is a
    // copy: were it a slice of the first batch, the first block would stay alive all epoch.
    let source = distribute_input::GeneratorSource::new(|| {
        [vec![0i64, 1], vec![2, 3], vec![4]]
            .into_iter()
            .map(|rows| Ok(Tensor::from_vec("/cpu:0", &[rows.len()], rows)?))
    });
    let ds = Dataset::from_source(source).batch(2, false).unwrap();
    let options = InputOptions {
        prefetch: 0,
        ..InputOptions::default()
    };
    let dist = DistributedDataset::new(ds, &local(2), options).unwrap();
    let mut it = dist.iter_per_replica();
    // Replica 0's [0] is a view of the first block.
    let block = it.next().unwrap().unwrap().values()[0].clone();
    assert_eq!(block.to_vec::<i64>().unwrap(), [0]);
    it.next().unwrap().unwrap();
    let last = it.next().unwrap().unwrap();
    assert_eq!(last.values()[1].shape(), [0]);
    assert!(
        block.array::<i64>().unwrap().is_unique(),
        "nothing but this test holds the first block once the pipeline has moved past it"
    );
}
