"""Servable `lenet`: a LeNet-style classifier of handwritten digits (lenet.mindir, batch size 2).

* classify_top1(image) -> label
* classify_top1_batch(image) -> label   (the same, with a batched Python pre-processing stage)

`image` is an encoded image file (PNG, JPEG, ...; any size, colour or grayscale) sent as bytes. `label` is the
predicted digit as a str, e.g. "7".
"""

import io

import numpy as np
from PIL import Image

from mindspore_serving.server import register

IMAGE_SIZE = 32
# The same normalisation as train_lenet.py: (pixel / 255 - MEAN) / STD
MEAN = 0.5
STD = 0.5
LABELS = [str(digit) for digit in range(10)]
MAX_PIXELS = 4096 * 4096  # the largest image decoded: a digit needs far less, and a decompression bomb more
Image.MAX_IMAGE_PIXELS = MAX_PIXELS  # PIL refuses twice as many before decoding (DecompressionBombError)


def _image_bytes(image):
    """MindSpore Serving passes MS_BYTES as a 1-D np.uint8 array; accept plain bytes too."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, np.ndarray):
        if image.dtype.kind == "S":  # a 0-d or 1-element numpy bytes object
            return image.reshape(-1)[0]
        return image.tobytes()
    raise TypeError(f"image should be bytes, but got {type(image).__name__}")


def preprocess(image):
    """Decode the image, convert it to grayscale, resize it to 32x32 and normalise it -> float32 [1, 32, 32]."""
    with Image.open(io.BytesIO(_image_bytes(image))) as img:
        width, height = img.size  # read from the header: nothing is decoded yet
        if width * height > MAX_PIXELS:
            raise ValueError(
                f"the image has {width}x{height} pixels, more than this servable decodes ({MAX_PIXELS} pixels)"
            )
        gray = img.convert("L")
    if gray.size != (IMAGE_SIZE, IMAGE_SIZE):
        gray = gray.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR)
    x = np.asarray(gray, np.float32) / 255.0
    return ((x - MEAN) / STD).astype(np.float32).reshape(1, IMAGE_SIZE, IMAGE_SIZE)


def preprocess_batch(instances):
    """Batched pre-processing: receives a list of instances (each a tuple holding one image), yields one result each."""
    for instance in instances:
        yield preprocess(instance[0])


def postprocess_top1(score):
    """Logits float32 [10] -> the label of the best class."""
    return LABELS[int(np.argmax(score))]


model = register.declare_model(model_file="lenet.mindir", model_format="MindIR", with_batch_dim=True)


@register.register_method(output_names=["label"])
def classify_top1(image):
    """Input image: bytes. Output label: str."""
    x = register.add_stage(preprocess, image, outputs_count=1)
    score = register.add_stage(model, x, outputs_count=1)
    label = register.add_stage(postprocess_top1, score, outputs_count=1)
    return label


@register.register_method(output_names=["label"])
def classify_top1_batch(image):
    """Input image: bytes. Output label: str. The pre-processing stage handles up to 2 instances per call."""
    x = register.add_stage(preprocess_batch, image, outputs_count=1, batch_size=2)
    score = register.add_stage(model, x, outputs_count=1)
    label = register.add_stage(postprocess_top1, score, outputs_count=1)
    return label
