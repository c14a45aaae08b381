"""The MNIST job in Keras: examples/keras_mnist.py as written (its PyTorch twin: mnist_torch.py).

    python examples/mnist_keras.py                        # MNIST-shaped data made here, 5 epochs
    python examples/mnist_keras.py --mnist ~/mnist        # real MNIST IDX files (or LOADPROF_MNIST=~/mnist)
    loadprof compare examples/mnist_keras.py --variants baseline,cache,amp,accum --png compare.png

The job (MNIST 20,000 + 5,000, 5 epochs) is timed as written, with caching +
prefetching, mixed precision and gradient accumulation. keras_mnist.py holds the
job (a tf.data pipeline with a per-element map, no cache, no prefetch); this file
runs it unchanged so that the two frameworks' scripts sit side by side. ``loadprof compare`` applies each variant from outside.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # keras_mnist, mnist_data, also under runpy

from keras_mnist import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
