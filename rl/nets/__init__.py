"""Network building blocks: MLP/CNN torsos and Q heads, CPU-fast convolutions, the IMPALA CNN, the
recurrent (LSTM) Q network. Imports: flax, jax only.
"""
