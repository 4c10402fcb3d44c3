"""LeNet-5 style network for 32x32 single-channel digits (conv-pool-conv-pool-dense x3), shared by
train_lenet.py and export_model.py."""

import mindspore.nn as nn
import mindspore.ops as ops


class LeNet5(nn.Cell):
    """Input float32 [N, 1, 32, 32] -> logits float32 [N, num_classes]."""

    def __init__(self, num_classes=10, num_channel=1):
        super().__init__()
        self.conv1 = nn.Conv2d(num_channel, 6, 5, pad_mode="valid")
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
        self.fc1 = nn.Dense(16 * 5 * 5, 120)
        self.fc2 = nn.Dense(120, 84)
        self.fc3 = nn.Dense(84, num_classes)
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = ops.Flatten()

    def construct(self, x):
        x = self.max_pool2d(self.relu(self.conv1(x)))  # [N, 6, 14, 14]
        x = self.max_pool2d(self.relu(self.conv2(x)))  # [N, 16, 5, 5]
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)
