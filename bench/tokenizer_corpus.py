"""Builds a deterministic text corpus from files every Debian machine has (for the tokenizer
benchmark and tests): /usr/share/common-licenses, the copyright files, changelogs and READMEs
under /usr/share/doc (gzip'ed ones decompressed), and Python's standard library sources.
Documents are paragraphs grouped up to about 4 KB; output is jsonl ({"text": ...} per line)."""
import argparse
import gzip
import json
import os


def _sources():
    roots = ["/usr/share/common-licenses", "/usr/share/doc"]
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                yield os.path.join(dirpath, name)
    for dirpath, dirnames, filenames in os.walk("/usr/lib/python3.11"):
        dirnames.sort()
        dirnames[:] = [d for d in dirnames if d not in ("test", "__pycache__", "site-packages")]
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def _read(path):
    try:
        if os.path.islink(path) or not os.path.isfile(path):
            return None
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read(4 << 20)
        elif os.path.splitext(path)[1] in ("", ".txt", ".md", ".rst", ".py", ".Debian") or \
                os.path.basename(path).startswith(("copyright", "README", "changelog", "NEWS")) or \
                "common-licenses" in path:
            with open(path, "rb") as f:
                data = f.read(4 << 20)
        else:
            return None
        if b"\0" in data:
            return None
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


def documents(target_bytes):
    total = 0
    for path in _sources():
        text = _read(path)
        if not text:
            continue
        doc = ""
        for paragraph in text.split("\n\n"):
            doc = doc + "\n\n" + paragraph if doc else paragraph
            if len(doc) >= 4096:
                yield doc
                total += len(doc.encode())
                doc = ""
                if total >= target_bytes:
                    return
        if doc:
            yield doc
            total += len(doc.encode())
            if total >= target_bytes:
                return


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--mb", type=float, default=30)
    args = parser.parse_args()
    n = 0
    with open(args.out + ".tmp", "w", encoding="utf-8") as f:
        for doc in documents(int(args.mb * 1e6)):
            f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
            n += 1
    os.replace(args.out + ".tmp", args.out)
    print(f"corpus={args.out} documents={n} bytes={os.path.getsize(args.out)}")


if __name__ == "__main__":
    main()
