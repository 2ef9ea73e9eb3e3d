"""The documentation's links lead somewhere, and README.md stays a front page.

Pages: README.md, BUILD.md and docs/*.md. Every relative link `[text](path)`,
`![alt](path)`, `[text](path#anchor)` (and a reference definition `[ref]: path`) must
name a file or folder of the repository; a `#anchor` into a markdown file must be one
of its headings' GitHub slugs (lowercase, punctuation removed, spaces to '-', '-1',
'-2' for repeats) or an explicit `<a id="...">`. Links to http(s)/mailto addresses and
pure `#anchor` links within a page are not checked. Code blocks and code spans are
not read. README.md is at most `MAX_README_LINES` lines and links to every docs page.
"""

import collections
import glob
import os
import re
import urllib.parse

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_README_LINES = 150

_FENCE = re.compile(r"^( *)(```|~~~).*?^\1\2[^\n]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_INLINE_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]"  # [text], one level of [] inside
                          r"\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # (target "title")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_HTML_ANCHOR = re.compile(r"<a\s[^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)


def pages(root=ROOT):
  """The pages, relative to `root`: README.md, BUILD.md, docs/*.md (those that exist)."""
  out = [p for p in ("README.md", "BUILD.md") if os.path.isfile(os.path.join(root, p))]
  out += sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))
  return out


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


def prose(text):
  """`text` without fenced code blocks and code spans (their links are not links)."""
  text = _FENCE.sub("", text)
  return _CODE_SPAN.sub("code", text)


def links(text):
  """Every link target of a markdown text, in order."""
  text = prose(text)
  return [m.group(2) for m in _INLINE_LINK.finditer(text)] + _REFERENCE.findall(text)


def slug(heading):
  """GitHub's anchor of a heading: its text lowercased, punctuation dropped, spaces to '-'."""
  text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)  # link -> its text
  text = re.sub(r"<[^>]+>", "", text)  # inline HTML
  text = text.strip().lower()
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def anchors(text):
  """The anchors a markdown text defines: heading slugs (repeats numbered) and <a id>."""
  counts = collections.Counter()
  out = set()
  for match in _HEADING.finditer(_FENCE.sub("", text)):
    base = slug(match.group(2))
    out.add(base if counts[base] == 0 else f"{base}-{counts[base]}")
    counts[base] += 1
  out.update(_HTML_ANCHOR.findall(text))
  return out


def broken_links(page, root=ROOT):
  """(page, target, reason) for every link of `page` (relative to `root`) that leads nowhere."""
  out = []
  directory = os.path.dirname(os.path.join(root, page))
  for target in links(_read(os.path.join(root, page))):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
      continue  # http(s), mailto, ...; an anchor within the page
    path, _, anchor = target.partition("#")
    full = os.path.normpath(os.path.join(directory, urllib.parse.unquote(path)))
    if os.path.relpath(full, root).startswith(os.pardir):
      out.append((page, target, "outside the repository"))
    elif not os.path.exists(full):
      out.append((page, target, "no such file"))
    elif anchor and full.endswith(".md"):
      if os.path.isdir(full) or urllib.parse.unquote(anchor) not in anchors(_read(full)):
        where = os.path.relpath(full, root)
        out.append((page, target, f"no heading or <a id> '{anchor}' in {where}"))
  return out


@pytest.mark.parametrize("page", pages())
def test_every_relative_link_resolves(page):
  assert not broken_links(page), broken_links(page)


def test_the_pages_are_found():
  found = pages()
  assert {"README.md", "BUILD.md", "docs/reproduction.md", "docs/running.md"} <= set(found), found


def test_readme_is_a_front_page():
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    count = len(f.read().splitlines())
  assert count <= MAX_README_LINES, f"README.md has {count} lines (at most {MAX_README_LINES})"


def test_readme_links_to_every_docs_page_and_each_exists():
  readme = _read(os.path.join(ROOT, "README.md"))
  linked = {urllib.parse.unquote(t.partition("#")[0]) for t in links(readme)}
  docs = {p for p in linked if p.startswith("docs/")}
  assert docs, "README.md links to no page under docs/"
  missing = sorted(p for p in docs if not os.path.isfile(os.path.join(ROOT, p)))
  assert not missing, f"README.md links to docs pages that do not exist: {missing}"
  unlinked = sorted(set(pages()) - {"README.md", "BUILD.md"} - linked)
  assert not unlinked, f"docs pages README.md does not link to: {unlinked}"


def test_the_checker_finds_broken_links(tmp_path):
  (tmp_path / "docs").mkdir()
  (tmp_path / "data").mkdir()
  (tmp_path / "README.md").write_text("# Top\n\n## A section: `code`, here!\n\n[ok](docs/a.md)\n")
  (tmp_path / "docs" / "a.md").write_text(
      "# Page A\n\n## Same\n\n## Same\n\n<a id=\"explicit\"></a>\n\n"
      "[up](../README.md#a-section-code-here) [second](#same-1) [dir](../data/)\n"
      "[explicit](a.md#explicit) [repeat](a.md#same-1) [web](https://example.com/x.md)\n"
      "`[in code](nowhere.md)`\n\n```\n[in a block](nowhere.md)\n```\n\n"
      "[gone](missing.md) [bad anchor](../README.md#no-such-heading)\n"
      "![img](../results/figures/x.png) [escape](../../outside.md)\n\n"
      "[ref]: also-missing.md\n")
  assert broken_links("README.md", root=str(tmp_path)) == []
  found = broken_links("docs/a.md", root=str(tmp_path))
  assert [(t, r.split(" ")[0]) for _, t, r in found] == [
      ("missing.md", "no"),
      ("../README.md#no-such-heading", "no"),
      ("../results/figures/x.png", "no"),
      ("../../outside.md", "outside"),
      ("also-missing.md", "no"),
  ], found
  assert "no heading or <a id> 'no-such-heading' in README.md" in found[1][2]


def test_slugs_follow_github():
  assert slug("Performance (VIRTUAL's client step; issue 22)") == \
      "performance-virtuals-client-step-issue-22"
  assert slug("The predictive: posterior means vs Monte Carlo (`--eval_samples`)") == \
      "the-predictive-posterior-means-vs-monte-carlo---eval_samples"
  assert slug("GPUs: what runs where") == "gpus-what-runs-where"
  assert slug("Secure sums on TFF's worker") == "secure-sums-on-tffs-worker"
