"""Privacy mode against the four attacks of its threat model (README, "Privacy mode"), on
tiny-llama and on a random Llama 2048 wide. Every attack is first run on unmasked traffic, where
it succeeds, so each assertion below can fail."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from catalogue.resolve import resolve_model
from tests.workers.remote.privacy_attacks import (
    label_recovery,
    layer0_dictionary,
    layer1_dictionary,
    pca_cosine,
    plain_model,
    record,
    token_recovery,
    wide_llama,
)
from wire.call.messages import Op
from workers.remote.privacy import PrivacyConfig

MODELS = ["tiny-llama", "wide-llama"]
MASKED = PrivacyConfig(seed=1)
# layer 0 remote too: the noise alone must hold, and needs to be larger for the same margin
MASKING_ALONE = PrivacyConfig(seed=1, local_layers=0, noise=3.0)
TRAINER = PrivacyConfig(seed=1, backward=True)


@pytest.fixture(scope="module")
def path(request, tmp_path_factory) -> Path:
    if request.param == "tiny-llama":
        return resolve_model("tiny-llama")
    return wide_llama(tmp_path_factory.mktemp("wide-llama"))


def token_ids(path: Path, sequences: int = 256, length: int = 4) -> torch.Tensor:
    vocab = plain_model(path).config.vocab_size
    return torch.randint(0, vocab, (sequences, length), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("path", MODELS, indirect=True)
def test_dictionary_and_inversion_attacks_recover_no_token(path: Path) -> None:
    plain = plain_model(path)
    ids = token_ids(path)
    layer0, layer1 = layer0_dictionary(plain), layer1_dictionary(plain)
    raw, _ = record(path, ids, None)
    assert token_recovery(raw, layer0, ids) >= 0.99  # layer 0's inputs: a public dictionary
    assert token_recovery(raw, layer1, ids, first_only=True) >= 0.99  # and layer 1's, by inversion
    for config in (MASKED, MASKING_ALONE):
        masked, logits = record(path, ids, config)
        dictionary = token_recovery(masked, layer0, ids)
        inversion = token_recovery(masked, layer1, ids, first_only=True)
        print(f"{path.name} local_layers={config.local_layers}: dictionary {dictionary:.3f}, "
              f"inversion {inversion:.3f}")
        assert dictionary <= 0.01 and inversion <= 0.01
    with torch.no_grad():
        exact = plain(input_ids=ids).logits
    _, logits = record(path, ids, MASKED)
    assert (logits - exact).abs().max() <= 1e-4 * exact.abs().max()  # exact at the defaults


@pytest.mark.parametrize("path", MODELS, indirect=True)
def test_training_labels_are_not_recovered_from_gradients(path: Path) -> None:
    plain = plain_model(path)
    ids = token_ids(path)
    raw, _ = record(path, ids, None, train=True)
    assert label_recovery(raw, plain, ids) >= 0.9
    for config in (TRAINER, PrivacyConfig(seed=1, backward=True, local_head=False)):
        masked, _ = record(path, ids, config, train=True)
        labels = label_recovery(masked, plain, ids)
        print(f"{path.name} local_head={config.head_local}: labels {labels:.3f}")
        assert masked.rows(Op.BACKWARD, plain.config.hidden_size, ids.numel())
        assert labels <= 0.01


@pytest.mark.parametrize("path", MODELS, indirect=True)
def test_principal_components_do_not_separate_noise_from_signal(path: Path) -> None:
    ids = token_ids(path, sequences=16, length=64)
    layer = "model.layers.1.mlp.down_proj"
    raw, _ = record(path, ids, None)
    masked, _ = record(path, ids, MASKED)
    truth, received = (next(x for _, spec, x in seen.calls() if spec.name == layer)
                       for seen in (raw, masked))
    cosine, how = pca_cosine(received, truth)
    print(f"{path.name}: cosine with the truth {cosine:.3f} at best ({how} components)")
    assert cosine <= 0.3
