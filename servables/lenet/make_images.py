"""Save a few real handwritten digits (from the held-out test split of sklearn's digits, never seen in training)
as 32x32 grayscale PNG files: ``images/digit_<label>_<i>.png``.

The pixels are exactly those the model was trained on (8x8 -> uint8 -> bilinear 32x32), so the served
pre-processing of these files reproduces the training inputs. Run from anywhere:
``python servables/lenet/make_images.py``.
"""

import os
import sys

from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGES_DIR = os.path.join(HERE, "images")
PER_LABEL = 2


def main(per_label=PER_LABEL):
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from train_lenet import load_split

    _, _, x_test, y_test = load_split()
    os.makedirs(IMAGES_DIR, exist_ok=True)
    written = []
    for label in range(10):
        picks = [i for i, y in enumerate(y_test) if y == label][:per_label]
        for n, index in enumerate(picks):
            path = os.path.join(IMAGES_DIR, f"digit_{label}_{n}.png")
            Image.fromarray(x_test[index], mode="L").save(path, format="PNG", optimize=True)
            written.append(path)
    print(f"wrote {len(written)} images to {IMAGES_DIR}")
    return written


if __name__ == "__main__":
    main()
