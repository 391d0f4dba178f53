"""Padding helpers for variable-length batches, as flash_attn.bert_padding defines them.

    from flashattn_cu.bert_padding import unpad_input, pad_input
    x_unpad, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, attention_mask)
    ...                                   # (total_tokens, ...) work, e.g. varlen attention
    x = pad_input(y_unpad, indices, batch, seqlen)

`attention_mask` is (batch, seqlen), nonzero (True / 1) for the tokens to keep. Tokens are kept in
row-major order, so sequence b occupies rows cu_seqlens[b]:cu_seqlens[b + 1] of the unpadded
tensor. Pure PyTorch (any device); gradients flow through every function.
"""

import torch

__all__ = ["index_first_axis", "index_first_axis_residual", "index_put_first_axis",
           "unpad_input", "unpad_input_for_concatenated_sequences", "pad_input"]


class _IndexFirstAxis(torch.autograd.Function):
    """input[indices] along the first axis; the backward scatters into zeros (no dense
    (batch * seqlen) x (total) gather matrix, no atomics: indices are unique)."""

    @staticmethod
    def forward(ctx, input, indices):
        ctx.save_for_backward(indices)
        ctx.first_axis = input.shape[0]
        return input.index_select(0, indices)

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        grad_input = grad_output.new_zeros((ctx.first_axis,) + tuple(grad_output.shape[1:]))
        grad_input.index_copy_(0, indices, grad_output)
        return grad_input, None


class _IndexPutFirstAxis(torch.autograd.Function):
    """A (first_axis, ...) tensor of zeros with values[i] at row indices[i]."""

    @staticmethod
    def forward(ctx, values, indices, first_axis):
        ctx.save_for_backward(indices)
        out = values.new_zeros((first_axis,) + tuple(values.shape[1:]))
        out.index_copy_(0, indices, values)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        return grad_output.index_select(0, indices), None, None


class _IndexFirstAxisResidual(torch.autograd.Function):
    """(input[indices], input detached): the gradient of both outputs reaches input (the
    residual's as it is, the selection's added at its rows)."""

    @staticmethod
    def forward(ctx, input, indices):
        ctx.save_for_backward(indices)
        return input.index_select(0, indices), input.detach()

    @staticmethod
    def backward(ctx, grad_output, grad_residual):
        (indices,) = ctx.saved_tensors
        # Unused outputs arrive as zeros (materialized grads); out of place, so no incoming
        # gradient buffer is modified.
        return grad_residual.index_add(0, indices, grad_output), None


def _check_indices(indices, what):
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1 or \
            indices.dtype not in (torch.int64, torch.int32):
        got = (f"a {indices.dim()}-d {indices.dtype} tensor" if isinstance(indices, torch.Tensor)
               else type(indices).__name__)
        raise ValueError(f"{what}: indices must be a 1-d int64 or int32 tensor, got {got}")
    return indices.long()


def index_first_axis(input, indices):
    """input[indices] along the first axis, e.g. the kept tokens of a (batch * seqlen, ...)
    tensor. input: at least 1-d; indices: 1-d integer tensor."""
    indices = _check_indices(indices, "index_first_axis")
    if input.dim() < 1:
        raise ValueError("index_first_axis: input must have at least one dimension")
    return _IndexFirstAxis.apply(input, indices)


def index_first_axis_residual(input, indices):
    """flash_attn's index_first_axis_residual: (input[indices], input.detach()), for a caller
    that keeps the whole input as a residual beside the selected rows; the gradients of both
    outputs flow back into input. input: at least 2-d (as flash_attn's)."""
    indices = _check_indices(indices, "index_first_axis_residual")
    if input.dim() < 2:
        raise ValueError("index_first_axis_residual: input must have at least two dimensions")
    return _IndexFirstAxisResidual.apply(input, indices)


def index_put_first_axis(values, indices, first_axis_dim):
    """The inverse of index_first_axis: zeros of first_axis_dim rows with values[i] at
    indices[i] (flash_attn's argument names)."""
    indices = _check_indices(indices, "index_put_first_axis")
    if values.shape[0] != indices.shape[0]:
        raise ValueError(f"index_put_first_axis: values has {values.shape[0]} rows but indices "
                         f"has {indices.shape[0]}")
    return _IndexPutFirstAxis.apply(values, indices, int(first_axis_dim))


def _unpadded(hidden_states, keep, seqlens):
    """The rows of hidden_states (batch, seqlen, ...) where keep (batch, seqlen) is set, in
    row-major order, their indices (int64) into the flattened batch * seqlen, and the int32
    cu_seqlens of the sequences `seqlens` cuts them into."""
    indices = torch.nonzero(keep.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.zeros(seqlens.shape[0] + 1, dtype=torch.int32, device=seqlens.device)
    torch.cumsum(seqlens, dim=0, dtype=torch.int32, out=cu_seqlens[1:])
    rows = hidden_states.reshape((-1,) + tuple(hidden_states.shape[2:]))
    return index_first_axis(rows, indices), indices, cu_seqlens


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """Drops the padding tokens of a padded batch.

    hidden_states: (batch, seqlen, ...); attention_mask: (batch, seqlen), nonzero where a token is
    kept; unused_mask (optional, (batch, seqlen)): tokens that are kept in the output but not
    counted in `seqused` (flash_attn 2.7's contract, for KV caches with allocated but unused
    slots). A token must not be set in both masks.

    Returns (hidden_states (total, ...), indices (total,) int64 into the flattened batch * seqlen,
    cu_seqlens (batch + 1,) int32, max_seqlen_in_batch (int), seqused (batch,) int32: the tokens
    of each sequence set in attention_mask).
    """
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(f"unpad_input: attention_mask must be (batch, seqlen) = "
                         f"{tuple(hidden_states.shape[:2])}, got {tuple(attention_mask.shape)}")
    keep = attention_mask.bool()
    if unused_mask is not None:
        if tuple(unused_mask.shape) != tuple(attention_mask.shape):
            raise ValueError(f"unpad_input: unused_mask must have attention_mask's shape "
                             f"{tuple(attention_mask.shape)}, got {tuple(unused_mask.shape)}")
        keep = keep | unused_mask.bool()
    seqlens = keep.sum(dim=-1, dtype=torch.int32)
    seqused = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    max_seqlen_in_batch = int(seqlens.max().item()) if seqlens.numel() > 0 else 0
    return (*_unpadded(hidden_states, keep, seqlens), max_seqlen_in_batch, seqused)


def unpad_input_for_concatenated_sequences(hidden_states, attention_mask_in_length):
    """Unpads a batch whose rows hold several short samples one after the other, as flash_attn's
    function of this name: attention_mask_in_length (batch, seqlen), integer, lists in row b the
    lengths of row b's samples (nonzero entries, in order; zeros are ignored), e.g. [2, 3, 0, 0,
    0, 0] for samples of 2 and 3 tokens at the start of a 6-token row. The first sum(row b)
    tokens of row b are kept, and every sample becomes its own sequence of the varlen layout.

    Returns (hidden_states (total, ...), indices (total,) int64 into the flattened batch * seqlen,
    cu_seqlens (samples + 1,) int32 over all samples in row-major order, max_seqlen_in_batch
    (int)): four values, as flash_attn's.
    """
    what = "unpad_input_for_concatenated_sequences"
    lengths = attention_mask_in_length
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 2 or \
            tuple(lengths.shape) != tuple(hidden_states.shape[:2]):
        got = tuple(lengths.shape) if isinstance(lengths, torch.Tensor) else type(lengths).__name__
        raise ValueError(f"{what}: attention_mask_in_length must be (batch, seqlen) = "
                         f"{tuple(hidden_states.shape[:2])}, got {got}")
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise ValueError(f"{what}: attention_mask_in_length must hold integer sample lengths, "
                         f"got {lengths.dtype}")
    seqlen = lengths.shape[1]
    lengths = lengths.long()
    per_row = lengths.sum(dim=-1)
    flat = lengths.flatten()
    # One host read (flash_attn's version reads the max as well), the check and the max
    # together: bad lengths would put one row's samples into the next row's tokens; with none
    # negative, the largest entry is the longest sample.
    bad = (lengths < 0).any() | (per_row > seqlen).any()
    largest = flat.max() if flat.numel() > 0 else flat.new_zeros(())
    bad, max_seqlen_in_batch = torch.stack([bad.long(), largest]).tolist()
    if bad:
        raise ValueError(f"{what}: attention_mask_in_length must hold non-negative sample "
                         f"lengths summing to at most seqlen={seqlen} in each row, got "
                         f"{lengths.tolist() if lengths.numel() <= 64 else 'larger tensor'}")
    seqlens = flat[flat != 0].to(torch.int32)
    keep = torch.arange(seqlen, device=lengths.device) < per_row.unsqueeze(1)
    return (*_unpadded(hidden_states, keep, seqlens), max_seqlen_in_batch)


def pad_input(hidden_states, indices, batch, seqlen):
    """Puts the rows of an unpadded (total, ...) tensor back at their places in a zero-padded
    (batch, seqlen, ...) tensor (indices as unpad_input returned them)."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.reshape((batch, seqlen) + tuple(hidden_states.shape[1:]))
