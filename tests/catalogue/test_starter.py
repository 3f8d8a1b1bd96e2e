"""`symbiosis demo`'s starter files (the README's walk-through): a LoRA adapter that plain peft
loads and that changes the model's output, and a training file the upload check accepts; a bad
model or an unwritable place is an error line and exit 1, not a traceback."""

from __future__ import annotations

import torch
from peft import PeftModel
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from catalogue.starter import EXAMPLES, main
from gateway.dataset import validate_jsonl


def test_the_starter_files_load_in_peft_and_pass_the_upload_check(tmp_path, capsys) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    assert "adapter" in capsys.readouterr().out
    path = resolve_model("tiny-llama")
    base = AutoModelForCausalLM.from_pretrained(path)
    ids = torch.tensor([[1, 5, 9, 13]])
    with torch.no_grad():
        plain = base(ids).logits
        tuned = PeftModel.from_pretrained(base, tmp_path / "adapter")(ids).logits
    assert not torch.allclose(plain, tuned, atol=1e-3)  # the adapter has an effect to see
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    report = validate_jsonl((tmp_path / "train.jsonl").read_bytes(),
                            lambda text: len(tokenizer.encode(text).ids), 2048)
    assert report.ok and report.format == "chat" and report.examples == EXAMPLES


def test_a_bad_model_or_place_is_an_error_line(tmp_path, capsys) -> None:
    assert main(["--model", "no-such-model", "--out", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: unknown model 'no-such-model'") and "tiny-llama" in error
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["--out", str(blocked / "examples")]) == 1
    assert capsys.readouterr().err.startswith("error: ")
