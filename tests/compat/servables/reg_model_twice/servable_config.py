"""The same model file declared twice: refused at start."""

from mindspore_serving.server import register

first = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False)
second = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False)
