//! JAX's CUDA plugin, on whatever machine runs the tests: its own create options, of every
//! value kind, pass its checks, and what it refuses it refuses with its own message. Without a
//! GPU (CI) a client then fails with the plugin's "no GPU" error; with one (the GPU bundle's
//! `pjrt-cuda-options` suite) it is created. The plugin is `PJRT_PLUGIN` where that names an
//! `xla_cuda_plugin.so` (as the bundle's `run.sh` sets it), else the one `cargo xtask fetch-pjrt
//! --plugin cuda` installs (`cargo xtask test` does so first).

use std::path::{Path, PathBuf};

use distribute_pjrt::{Client, ClientOptions, PLUGIN_ENV, Plugin, PluginOption};

/// Where `cargo xtask fetch-pjrt --plugin cuda` installs the plugin.
const INSTALLED: &str = "target/pjrt/jax-cuda13-pjrt-0.11.2/xla_cuda_plugin.so";
/// The plugin's file name in JAX's wheels.
const FILE_NAME: &str = "xla_cuda_plugin.so";

fn cuda_plugin() -> &'static Plugin {
    let path = std::env::var_os(PLUGIN_ENV)
        .map(PathBuf::from)
        .filter(|path| path.file_name().is_some_and(|name| name == FILE_NAME))
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join(INSTALLED)
        });
    assert!(
        path.is_file(),
        "no CUDA PJRT plugin at {}: run `cargo xtask fetch-pjrt --plugin cuda`",
        path.display()
    );
    Plugin::load(&path).unwrap_or_else(|err| panic!("{err}"))
}

fn with(options: Vec<(&str, PluginOption)>) -> ClientOptions {
    ClientOptions {
        plugin_options: options
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect(),
        ..ClientOptions::default()
    }
}

/// The plugin's answer: `Ok(platform)` with a GPU, else its error's text.
fn create(options: &ClientOptions) -> Result<String, String> {
    Client::new(cuda_plugin(), options)
        .map(|client| client.platform_name().unwrap())
        .map_err(|err| err.to_string())
}

#[test]
fn options_of_every_kind_pass_the_plugins_checks() {
    let options = with(vec![
        ("preallocate", PluginOption::Bool(false)),
        ("memory_fraction", PluginOption::Float(0.5)),
        ("allocator", PluginOption::String("bfc".into())),
        ("visible_devices", PluginOption::Int64List(vec![0])),
        ("node_id", PluginOption::Int64(0)),
    ]);
    match create(&options) {
        Ok(platform) => assert_eq!(platform, "cuda"),
        Err(text) => {
            println!("no GPU here: {text}");
            assert!(!text.contains("Unexpected option"), "{text}");
            assert!(!text.contains("type"), "{text}");
        }
    }
}

/// The offer's probe asks the CUDA plugin not to preallocate, which it accepts: without a GPU
/// the probe fails with the plugin's "no GPU" error (and is not remembered), with one it counts
/// the GPUs.
#[test]
fn the_offer_asks_the_cuda_plugin_without_preallocating() {
    match cuda_plugin().offer() {
        Ok(offer) => {
            assert_eq!(offer.platform(), "cuda");
            assert!(offer.most_devices().is_some_and(|n| n >= 1), "{offer:?}");
        }
        Err(err) => {
            let text = err.to_string();
            assert!(text.contains("No visible GPU devices"), "{text}");
            let again = cuda_plugin().offer().unwrap_err().to_string();
            assert_eq!(again, text);
        }
    }
}

#[test]
fn unknown_and_mistyped_options_get_the_plugins_own_refusal() {
    let err = create(&with(vec![("bogus", PluginOption::Bool(true))])).unwrap_err();
    assert!(
        err.contains("Unexpected option name passed to PJRT_Client_Create: bogus"),
        "{err}"
    );
    let err = create(&with(vec![("preallocate", PluginOption::Int64(0))])).unwrap_err();
    println!("{err}");
    assert!(err.contains("preallocate"), "{err}");
}

#[test]
fn the_cpu_device_count_is_refused_as_a_plugin_option_before_the_plugin_sees_it() {
    let err = create(&with(vec![("cpu_device_count", PluginOption::Int64(2))])).unwrap_err();
    assert!(
        err.contains("set ClientOptions::cpu_device_count instead"),
        "{err}"
    );
    let twice = with(vec![
        ("preallocate", PluginOption::Bool(false)),
        ("preallocate", PluginOption::Bool(true)),
    ]);
    let err = create(&twice).unwrap_err();
    assert!(
        err.contains("plugin option preallocate is given twice"),
        "{err}"
    );
}
