import pytest

from kvplan.core.dtypes import KV_DTYPE_CHOICES, ScaleGranularity, all_dtypes, get_dtype
from kvplan.errors import InputError


@pytest.mark.parametrize(
    "name,elems,expected",
    [
        ("fp32", 128, 512),
        ("bf16", 128, 256),
        ("fp16", 128, 256),
        ("fp8", 128, 128),  # per-tensor scales only: nothing per token
        ("fp8_e5m2", 576, 576),
        ("int8", 128, 128 + 4),  # fp16 scale + fp16 zero per token-head
        ("int4", 128, 64 + 4),
        ("nvfp4", 128, 64 + 8),  # one e4m3 scale per 16 values
        ("nvfp4", 72, 36 + 5),  # a partial group still carries a scale
        ("fp8_per_token_head", 64, 64 + 4),  # one fp32 scale per token-head vector (vLLM 0.20.0)
        ("int8_per_token_head", 128, 128 + 4),
        ("fp8_ds_mla", 576, 656),  # 512 fp8 + 4 fp32 scales + 64 bf16 RoPE (vLLM 0.11.0)
    ],
)
def test_vector_bytes(name, elems, expected):
    assert get_dtype(name).vector_bytes(elems) == expected


@pytest.mark.parametrize("alias,name", [("float16", "fp16"), ("torch.bfloat16", "bf16"), ("FP8", "fp8_e4m3"),
                                        ("float32", "fp32"), ("fp4", "nvfp4")])
def test_aliases(alias, name):
    assert get_dtype(alias).name == name


def test_unknown_dtype_lists_choices():
    with pytest.raises(InputError, match="use one of: auto, "):
        get_dtype("fp7")


# The formats the README and `--kv-cache-dtype` help promise, written out here rather than read from the
# table under test: a format dropped from (or added to) the table without the docs fails this.
DOCUMENTED = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8_e4m3": 8, "fp8_e5m2": 8, "int8": 8, "int4": 4, "nvfp4": 4,
              "fp8_per_token_head": 8, "int8_per_token_head": 8, "fp8_ds_mla": 8}


def test_the_table_holds_exactly_the_documented_formats():
    assert {d.name: d.bits for d in all_dtypes()} == DOCUMENTED
    assert set(KV_DTYPE_CHOICES) >= {"auto", *DOCUMENTED}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_scales_are_consistent(name):
    d = get_dtype(name)
    if d.scale is ScaleGranularity.GROUP:
        assert d.group_elems > 0 and d.scale_bytes > 0
    if d.scale in (ScaleGranularity.NONE, ScaleGranularity.TENSOR):
        assert d.scale_bytes_for(4096) == 0
        assert d.vector_bytes(4096) == 4096 * DOCUMENTED[name] // 8


def test_sub_byte_has_no_plain_width():
    with pytest.raises(InputError):
        get_dtype("int4").bytes_per_elem_plain
    assert get_dtype("bf16").bytes_per_elem_plain == 2


def test_fp8_ds_mla_is_only_the_deepseek_latent_layout():
    with pytest.raises(InputError, match="fixed layout for 576-element vectors"):
        get_dtype("fp8_ds_mla").vector_bytes(128)
