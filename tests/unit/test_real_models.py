"""The lab's real model sizes (hvdlab.torch.real_models, hvdlab.tensorflow.real_models) hold the reference
architectures' parameter and gradient-tensor counts, and their synthetic batches and losses reach every tensor.

The references:
* torchvision ``resnet50()``: 25,557,032 parameters in 161 tensors (53 convolutions without bias, 53 batch norms of
  2 tensors, the classifier's 2);
* Hugging Face ``BertModel`` of ``bert-base-uncased`` with its pooler: 109,482,240 parameters in 199 tensors (3
  embeddings + their layer norm's 2, 12 layers of 16, the pooler's 2);
* ``keras.applications.ResNet50(weights=None)`` with its top: 25,583,592 trainable parameters in 214 tensors. Keras'
  convolutions carry biases, so its counts differ from torchvision's: the same network plus one bias per
  convolution, 53 tensors and 26,560 values (the sum of the 53 convolutions' output channels); the test derives that
  from the torch network rather than trusting the number (keras.io's table lists the model at 25.6M, total with the
  batch norms' 53,120 moving statistics: 25,636,712).
"""
import math

import pytest

TORCHVISION_RESNET50 = (25_557_032, 161)
HF_BERT_BASE = (109_482_240, 199)


@pytest.fixture(scope="module")
def torch_models():
    torch = pytest.importorskip("torch")
    from hvdlab.torch import real_models

    torch.manual_seed(0)
    return {name: real_models.build(name) for name in real_models.MODELS}


def test_torch_models_have_the_reference_counts(torch_models):
    from hvdlab.torch.real_models import gradient_tensors

    assert gradient_tensors(torch_models["resnet50"]) == TORCHVISION_RESNET50
    assert gradient_tensors(torch_models["bert-base"]) == HF_BERT_BASE


@pytest.mark.parametrize("name,size,batch", [("resnet50", 32, 2), ("bert-base", 8, 2)])
def test_torch_batch_and_loss_give_every_tensor_a_gradient(torch_models, name, size, batch):
    import torch

    from hvdlab.torch import real_models

    model = torch_models[name]
    model.zero_grad(set_to_none=True)
    b = real_models.batch(name, size, batch, seed=3)
    first = next(iter(b.values()))
    assert first.shape[0] == batch and first.shape[-1] == size
    real_models.loss(name, model, b).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert missing == []
    # The same seed gives the same batch; another seed another.
    again, other = real_models.batch(name, size, batch, seed=3), real_models.batch(name, size, batch, seed=4)
    assert all(torch.equal(b[k], again[k]) for k in b)
    assert not torch.equal(b[next(iter(b))], other[next(iter(b))])


def test_bert_masks_its_share_of_positions():
    from hvdlab.torch import real_models

    b = real_models.batch("bert-base", 40, 3)
    assert b["masked"].shape == (3, math.ceil(0.15 * 40))
    assert all(len(set(row.tolist())) == b["masked"].shape[1] for row in b["masked"])   # no position twice


@pytest.mark.parametrize("name,size,batch", [("resnet50", 32, 1), ("resnet50", 16, 4), ("bert-base", 513, 1),
                                             ("nope", 64, 1), ("bert-base", 0, 1)])
def test_bad_sizes_are_refused_by_name(name, size, batch):
    from hvdlab.torch import real_models

    with pytest.raises(ValueError, match="size|model"):
        real_models.batch(name, size, batch)


def test_keras_models_have_the_reference_counts(torch_models):
    pytest.importorskip("keras")
    from hvdlab.tensorflow import real_models

    # Keras' ResNet50 = torchvision's + one bias per convolution.
    convs = [m for m in torch_models["resnet50"].modules() if type(m).__name__ == "Conv2d"]
    assert len(convs) == 53
    bias_values = sum(c.out_channels for c in convs)
    assert bias_values == 26_560
    keras_resnet = (TORCHVISION_RESNET50[0] + bias_values, TORCHVISION_RESNET50[1] + len(convs))
    assert keras_resnet == (25_583_592, 214)
    assert real_models.gradient_tensors(real_models.build("resnet50", 64)) == keras_resnet
    assert real_models.gradient_tensors(real_models.build("bert-base")) == HF_BERT_BASE


def test_keras_batches_match_the_torch_shapes():
    pytest.importorskip("keras")
    from hvdlab.tensorflow import real_models

    b = real_models.batch("resnet50", 64, 2)
    assert b["x"].shape == (2, 64, 64, 3) and b["y"].shape == (2,)
    b = real_models.batch("bert-base", 16, 2)
    assert b["ids"].shape == (2, 16) and b["masked"].shape == (2, 3)
    assert (b["targets"] == b["ids"][[[0], [1]], b["masked"]]).all()
