"""Peer measurement for issue 16: the demo's MLP (11 -> H tanh -> 1, momentum SGD, f32) trained
with `jax.jit` on one device, to compare with `demo --strategy tpu --replicas 1`.

Not part of the build or CI; `cargo xtask bench strategy` runs it beside the `tpu` cases where
python3 imports jax, and prints the ratio measured in that run. Usage (CPU wheels from PyPI,
`pip install jax`):

    python3 examples/demo/peers/jax_mlp.py --hidden 32 --batch 128 [--steps 2000]
                                           [--feed device|host] [--hlo]

Each step updates weights and momentum slots with buffer donation and returns the batch's
loss, which the loop reads back every step as the demo does. `--feed device` (the default)
takes batches that are already on the device, a pool of 64 put there before the timed loop:
the step alone. `--feed host` cuts each global batch from a copy of the training rows
shuffled once per epoch (NumPy) and passes it to the step, which copies it to the device: a
user's loop with its input, as the demo's timed loop has.
Prints `jax <version> hidden H batch B feed F: N steps/s`.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--feed", choices=["device", "host"], default="device")
    p.add_argument("--hlo", action="store_true", help="print the step's StableHLO and exit")
    a = p.parse_args()

    rng = np.random.default_rng(7)
    rows = 1279
    x_all = rng.standard_normal((rows, 11)).astype(np.float32)
    y_all = rng.standard_normal(rows).astype(np.float32)
    params = {
        "w1": jnp.asarray(rng.standard_normal((11, a.hidden)).astype(np.float32) * 0.3),
        "b1": jnp.zeros((a.hidden,), jnp.float32),
        "w2": jnp.asarray(rng.standard_normal((a.hidden,)).astype(np.float32) * 0.3),
        "b2": jnp.zeros((1,), jnp.float32),
    }
    velocity = jax.tree.map(jnp.zeros_like, params)

    def loss_fn(p, x, y):
        hidden = jnp.tanh(x @ p["w1"] + p["b1"])
        predicted = hidden @ p["w2"] + p["b2"][0]
        return jnp.mean((predicted - y) ** 2)

    def step(p, v, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        v = jax.tree.map(lambda v, g: a.momentum * v + g, v, g)
        p = jax.tree.map(lambda w, v: w - a.lr * v, p, v)
        return p, v, loss

    step = jax.jit(step, donate_argnums=(0, 1))

    # Batches cut from a reshuffled copy of the data, put on the device ahead of the loop.
    order = np.concatenate([rng.permutation(rows) for _ in range(a.batch * 64 // rows + 2)])
    batches = [
        (jax.device_put(x_all[order[i * a.batch:(i + 1) * a.batch]]),
         jax.device_put(y_all[order[i * a.batch:(i + 1) * a.batch]]))
        for i in range(64)
    ]
    if a.hlo:
        print(step.lower(params, velocity, *batches[0]).as_text())
        return
    def host_batches():
        while True:
            order = rng.permutation(rows)
            x_epoch, y_epoch = x_all[order], y_all[order]
            for start in range(0, rows - a.batch + 1, a.batch):
                yield x_epoch[start:start + a.batch], y_epoch[start:start + a.batch]

    feed = host_batches()
    for i in range(50):  # compile and warm up
        x, y = batches[i % 64] if a.feed == "device" else next(feed)
        params, velocity, loss = step(params, velocity, x, y)
        float(loss)
    start = time.perf_counter()
    for i in range(a.steps):
        x, y = batches[i % 64] if a.feed == "device" else next(feed)
        params, velocity, loss = step(params, velocity, x, y)
        float(loss)
    seconds = time.perf_counter() - start
    print(f"jax {jax.__version__} hidden {a.hidden} batch {a.batch} feed {a.feed}: "
          f"{a.steps / seconds:.0f} steps/s")


if __name__ == "__main__":
    main()
