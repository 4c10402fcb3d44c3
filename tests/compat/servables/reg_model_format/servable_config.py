"""A model format MindSpore Serving does not know: refused at start."""

from mindspore_serving.server import register

model = register.declare_model(model_file="tensor_add.mindir", model_format="ONNX", with_batch_dim=False)
