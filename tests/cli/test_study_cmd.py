from posbias.cli.study_cmd import summary_head


def test_study_prints_the_head_of_its_summary_and_its_path(tmp_path):
    path = tmp_path / "summary.md"
    path.write_text("\n".join(f"line {i}" for i in range(93)), encoding="utf-8")
    out = summary_head(path).splitlines()
    assert out[:30] == [f"line {i}" for i in range(30)]
    assert out[30:] == ["... (63 more lines)", f"summary: {path}"]
    path.write_text("short\n", encoding="utf-8")
    assert summary_head(path).splitlines() == ["short", f"summary: {path}"]
