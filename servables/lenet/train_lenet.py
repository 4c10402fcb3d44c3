"""Train the LeNet-style digit classifier on scikit-learn's 8x8 handwritten digits with MindSpore on CPU.

Each 8x8 digit (values 0..16) becomes a uint8 grayscale image (v * 255 / 16), is resized to 32x32 with PIL's
bilinear filter, then normalised as ``(pixel / 255 - MEAN) / STD``; the served pre-processing (servable_config.py)
does the same on PNG images. The checkpoint is written to ``lenet_digits.ckpt`` next to this file.

Run from anywhere: ``python servables/lenet/train_lenet.py`` (about 10-20 s on 2 cores).
"""

import os
import sys
import time

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
CKPT_FILE = os.path.join(HERE, "lenet_digits.ckpt")
IMAGE_SIZE = 32
MEAN = 0.5
STD = 0.5
SPLIT_SEED = 0
TEST_FRACTION = 0.25
SEED = 1
EPOCHS = 12
BATCH = 32
LEARNING_RATE = 0.002


def digit_to_image(digit8x8):
    """An 8x8 sklearn digit (float 0..16) as a 32x32 grayscale PIL image."""
    pixels = np.clip(np.rint(np.asarray(digit8x8, np.float64) * 255.0 / 16.0), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, mode="L").resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR)


def normalize(gray):
    """uint8 [32, 32] grayscale -> float32 [1, 32, 32], as the served pre-processing does."""
    x = np.asarray(gray, np.float32) / 255.0
    return ((x - MEAN) / STD).astype(np.float32).reshape(1, IMAGE_SIZE, IMAGE_SIZE)


def load_split():
    """(train_images, train_labels, test_images, test_labels); images are 32x32 uint8 arrays."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.stack([np.asarray(digit_to_image(d)) for d in digits.images])
    labels = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=labels
    )
    return x_train, y_train, x_test, y_test


def to_batch(images):
    """uint8 [N, 32, 32] -> float32 [N, 1, 32, 32]."""
    return np.stack([normalize(img) for img in images])


def evaluate(net, images, labels):
    import mindspore as ms

    x = to_batch(images)
    logits = net(ms.Tensor(x)).asnumpy()
    return float((logits.argmax(axis=1) == labels).mean())


def main():
    import mindspore as ms
    import mindspore.nn as nn

    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from lenet_net import LeNet5

    from mindspore_serving.common.ms_device import select_device

    select_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(SEED)
    start = time.time()
    x_train, y_train, x_test, y_test = load_split()
    train_x = to_batch(x_train)

    net = LeNet5()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Adam(net.trainable_params(), learning_rate=LEARNING_RATE)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer)
    step.set_train()
    rng = np.random.default_rng(SEED)
    steps_per_epoch = len(train_x) // BATCH  # fixed batch shape: one graph compilation
    for epoch in range(EPOCHS):
        order = rng.permutation(len(train_x))
        losses = []
        for i in range(steps_per_epoch):
            idx = order[i * BATCH : (i + 1) * BATCH]
            losses.append(float(step(ms.Tensor(train_x[idx]), ms.Tensor(y_train[idx])).asnumpy()))
        print(f"epoch {epoch + 1}/{EPOCHS} loss {np.mean(losses):.4f}")
    net.set_train(False)
    train_acc = evaluate(net, x_train, y_train)
    test_acc = evaluate(net, x_test, y_test)
    ms.save_checkpoint(net, CKPT_FILE)
    print(
        f"train accuracy {train_acc:.4f}, test accuracy {test_acc:.4f} ({len(y_test)} images), "
        f"{time.time() - start:.1f} s; saved {CKPT_FILE} ({os.path.getsize(CKPT_FILE)} bytes)"
    )
    return test_acc


if __name__ == "__main__":
    main()
