"""Small shared primitives every room uses: the schema and reserved keys, argument checks, ring arithmetic.

Pure Python/torch: nothing here imports torchrl, and nothing here imports another room.
"""
