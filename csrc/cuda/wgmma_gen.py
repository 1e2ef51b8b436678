# Writes the explicit wgmma operand lists into wgmma.cuh (inline asm needs every register spelled out):
#   python csrc/cuda/wgmma_gen.py
Ns = (16, 32, 64, 128, 256)
out = []
def d_list(n): return ", ".join(f"%{i}" for i in range(n // 2))
def d_ops(n): return ", ".join(f'"+f"(d[{i}])' for i in range(n // 2))
for n in Ns:
    r = n // 2
    blocks = []
    for form in ("ss", "rs"):
        if form == "ss":
            sig = "float* d, uint64_t a, uint64_t b, int accumulate"
            a_txt = f"%{r + 1}"; b_txt = f"%{r + 2}"; tr = f"1, 1, 0, %{r + 3}"
            ins = '"r"(accumulate), "l"(a), "l"(b), "n"(kTransB)'
        else:
            sig = "float* d, const uint32_t (&a)[4], uint64_t b, int accumulate"
            a_txt = f"{{%{r + 1}, %{r + 2}, %{r + 3}, %{r + 4}}}"; b_txt = f"%{r + 5}"; tr = f"1, 1, %{r + 6}"
            ins = '"r"(accumulate), "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(kTransB)'
        # One instruction text per form; TY (a string literal) names the operand type inside it.
        asm = (f'#define KDTREE_WGMMA(TY) asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r}, 0;\\n" \\\n'
               f'    "wgmma.mma_async.sync.aligned.m64n{n}k16.f32." TY "." TY " {{{d_list(n)}}}, {a_txt}, {b_txt}, p, {tr};\\n}}\\n" \\\n'
               f'    : {d_ops(n)} \\\n    : {ins})')
        blocks.append(f"""  template <bool kBf16, int kTransB>
  __device__ __forceinline__ static void {form}({sig}) {{
{asm}
    if constexpr (kBf16) KDTREE_WGMMA("bf16");
    else KDTREE_WGMMA("f16");
#undef KDTREE_WGMMA
  }}""")
    out.append(f"template <>\nstruct Wgmma<{n}> {{\n" + "\n".join(blocks) + "\n};\n")
import pathlib, re
header = pathlib.Path(__file__).with_name("wgmma.cuh")
text = header.read_text()
begin, end = "// BEGIN GENERATED (wgmma_gen.py)\n", "// END GENERATED\n"
head, rest = text.split(begin)
_, tail = rest.split(end)
header.write_text(head + begin + "\n".join(out) + end + tail)
