"""The two real model sizes of the lab's model benchmarks (``benchmarks/models.py``), as plain torch modules.

* :func:`resnet50`: ResNet-50 with torchvision's architecture (``torchvision.models.resnet50``: v1.5, the stride in
  each first bottleneck's 3x3 convolution, convolutions without bias, 1000 classes): 25,557,032 parameters in 161
  tensors. torchvision's wheel here is built for CUDA torch and does not load beside the CPU torch, so the network is
  written out; ``tests/unit/test_real_models.py`` holds it to torchvision's counts.
* :func:`bert_base`: a BERT-base encoder with Hugging Face ``BertModel``'s shapes (``bert-base-uncased``: 12 layers,
  hidden 768, 12 heads, FFN 3072, vocabulary 30,522, 512 positions, 2 token types, the pooler): 109,482,240
  parameters in 199 tensors. Its loss is masked-token prediction through the word embeddings (tied decoder, as
  BERT's pre-training head ties it), so it adds no parameter and every tensor gets a gradient.

Each has ``batch(model_name, size, batch, seed)`` (:func:`batch`): a synthetic batch at a chosen input size (image
side, sequence length) and :func:`loss`: the step's loss on it. The sizes that put a step's compute against its
gradient's ring time where a GPU cluster puts it are :mod:`hvdlab.bench.sizing`'s.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

MODELS = ("resnet50", "bert-base")


# ---- ResNet-50 (torchvision's layout and names) ---------------------------------------------------------------
class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        # v1.5: the stride sits in the 3x3 convolution (torchvision's choice), not in the first 1x1.
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._layer(64, 3)
        self.layer2 = self._layer(128, 4, stride=2)
        self.layer3 = self._layer(256, 6, stride=2)
        self.layer4 = self._layer(512, 3, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * 4, num_classes)
        for m in self.modules():   # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(num_classes: int = 1000) -> ResNet50:
    return ResNet50(num_classes)


# ---- BERT-base (Hugging Face BertModel's shapes) ---------------------------------------------------------------
BERT_BASE = {"vocab": 30522, "hidden": 768, "layers": 12, "heads": 12, "ffn": 3072, "positions": 512, "types": 2}
MASKED_SHARE = 0.15   # BERT's masked-token share


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, ffn)
        self.output = nn.Linear(ffn, hidden)
        self.out_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape

        def split(t):
            return t.view(b, s, self.heads, h // self.heads).transpose(1, 2)

        ctx = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)), split(self.value(x)))
        x = self.attn_norm(x + self.attn_out(ctx.transpose(1, 2).reshape(b, s, h)))
        return self.out_norm(x + self.output(F.gelu(self.intermediate(x))))


class BertBase(nn.Module):
    def __init__(self, vocab: int = 30522, hidden: int = 768, layers: int = 12, heads: int = 12, ffn: int = 3072,
                 positions: int = 512, types: int = 2) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(positions, hidden)
        self.token_type = nn.Embedding(types, hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, ffn) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)
        for m in self.modules():   # BERT's initialisation: normal(0, 0.02)
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: torch.Tensor, types: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.embed_norm(self.word(ids) + self.position(pos)[None] + self.token_type(types))
        for layer in self.layers:
            x = layer(x)
        return x, torch.tanh(self.pooler(x[:, 0]))


def bert_base() -> BertBase:
    return BertBase(**BERT_BASE)


# ---- what a benchmark step needs ------------------------------------------------------------------------------
def build(name: str) -> nn.Module:
    if name == "resnet50":
        return resnet50()
    if name == "bert-base":
        return bert_base()
    raise ValueError(f"model: {name!r} is not allowed; choose one of: {', '.join(MODELS)}")


def batch(name: str, size: int, batch_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A synthetic batch of ``batch_size`` samples for model ``name``: images ``size`` x ``size`` and labels of 1000
    classes (``resnet50``), or ``size`` token ids of 2 segments, with MASKED_SHARE of the positions (at least one)
    to predict (``bert-base``)."""
    if size < 1 or batch_size < 1:
        raise ValueError(f"size {size!r}, batch {batch_size!r}: both must be integers >= 1")
    g = torch.Generator().manual_seed(seed)
    if name == "resnet50":
        # Five halvings: the last stage sees ceil(size / 32)^2 pixels per image, and batch normalisation in
        # training needs more than one value per channel there.
        if size < 32 or batch_size * math.ceil(size / 32) ** 2 < 2:
            raise ValueError(f"size {size}, batch {batch_size}: not allowed for resnet50; images of at least 32 x 32, "
                             f"and batch x ceil(size / 32)^2 >= 2 (batch normalisation at the last stage)")
        return {"x": torch.randn(batch_size, 3, size, size, generator=g),
                "y": torch.randint(0, 1000, (batch_size,), generator=g)}
    if name == "bert-base":
        if size > BERT_BASE["positions"]:
            raise ValueError(f"size: {size} is not allowed for bert-base; at most {BERT_BASE['positions']} tokens")
        ids = torch.randint(0, BERT_BASE["vocab"], (batch_size, size), generator=g)
        types = (torch.arange(size) >= size // 2).long().expand(batch_size, size).contiguous()
        n_mask = max(1, math.ceil(MASKED_SHARE * size))
        masked = torch.stack([torch.randperm(size, generator=g)[:n_mask] for _ in range(batch_size)])
        return {"ids": ids, "types": types, "masked": masked, "targets": torch.gather(ids, 1, masked)}
    raise ValueError(f"model: {name!r} is not allowed; choose one of: {', '.join(MODELS)}")


def loss(name: str, model: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
    """The step's loss: cross-entropy over 1000 classes (``resnet50``); over the vocabulary at the masked positions,
    the decoder tied to the word embeddings, plus a term on the pooled output so the pooler gets a gradient too
    (``bert-base``; in BERT the next-sentence head does that)."""
    if name == "resnet50":
        return F.cross_entropy(model(b["x"]), b["y"])
    if name == "bert-base":
        seq, pooled = model(b["ids"], b["types"])
        idx = b["masked"].unsqueeze(-1).expand(-1, -1, seq.shape[-1])
        logits = torch.gather(seq, 1, idx) @ model.word.weight.T
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["targets"].reshape(-1)) + pooled.pow(2).mean()
    raise ValueError(f"model: {name!r} is not allowed; choose one of: {', '.join(MODELS)}")


def gradient_tensors(model: nn.Module) -> tuple[int, int]:
    """``(parameters, tensors)`` that get a gradient."""
    ps = [p for p in model.parameters() if p.requires_grad]
    return sum(p.numel() for p in ps), len(ps)
