"""The model catalogue both sides read: the built-in models (`builtin`, with their tokenizer),
where models live on disk (`paths`, torch-free), how a name becomes a model directory
(`resolve`), and which layers are base layers (`base_layers`)."""
