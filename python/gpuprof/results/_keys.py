"""What names an op row; with its input shapes, what makes two windows' op rows one
row (``ops()`` fields)."""

OP_NAME_KEY = ("name", "file", "line", "kind")
OP_KEY = OP_NAME_KEY + ("input_shapes",)
