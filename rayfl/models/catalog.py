"""rayfl's own networks, registered like a user's: by import path, imported on first use."""

from rayfl.registry import MODELS

for name, where, config, summary in [
    ("linear", "networks:build_linear", "networks:LinearConfig", "Multinomial logistic regression (one Linear layer)"),
    ("mlp", "networks:build_mlp", "networks:MLPConfig", "Fully connected network, ReLU or softplus hidden layers"),
    ("relu1", "networks:build_relu1", "networks:ReLU1Config", "One-hidden-layer ReLU network (FedRZO)"),
    ("conv4", "networks:build_conv4", "networks:Conv4Config", "MAML's Conv-4: four conv / BatchNorm / ReLU / pool blocks"),
    ("resnet18", "resnet:build_resnet18", "resnet:ResNet18Config", "ResNet-18 with GroupNorm (FFGG's EMNIST and GLDv2 network)"),
    ("femnist_cnn", "leaf:build_femnist_cnn", "leaf:FemnistCNNConfig", "LEAF's FEMNIST CNN: two 5x5 conv / pool layers, dense 2048"),
    ("char_lstm", "leaf:build_char_lstm", "leaf:CharLSTMConfig", "LEAF's Shakespeare model: embedding 8, 2-layer LSTM of 256"),
    ("transformer", "transformer:build_transformer", "transformer:TransformerConfig", "Causal transformer language model (FFGG's StackOverflow)"),
]:
    MODELS.register(name, f"rayfl.models.{where}", config=f"rayfl.models.{config}", summary=summary, origin="built-in")
