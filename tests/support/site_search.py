"""The docs site's search, as a reader's browser runs it: mkdocs-material's search worker rebuilt on
the `lunr` package (lunr.js 2.3.9 in Python) over the built `search/search_index.json`.

What the worker does, and so what this does (mkdocs-material 9's `integrations/search`):

- the index: lunr with `b = 0`, the index's `config.fields` and their boosts (a title counts far
  more than the text), each document's own `boost` (a page's `search: boost:` front matter), only
  the pipeline functions `config.pipeline` names, and its own tokenizer: the text between HTML tags
  split at `config.separator` (the search plugin's `separator`), lower-cased;
- a query: each word lexed as lunr does (`gs:` would be a field: the worker turns the colon into a
  space), each term split at the separator, a trailing wildcard added (`sweep` finds `sweeps`);
- the ranking: lunr's score times `1 + boost ** 2`, where `boost` is 1 for a page (not a section of
  it) plus the share of the query's terms the result matched; results grouped by page, pages in
  the order of their best result.
"""

import json
import re
from typing import Dict, List

from lunr.builder import Builder
from lunr.query_lexer import QueryLexer
from lunr.stop_word_filter import stop_word_filter

FIELDS = ("title", "text", "tags")


def _tokens(value, separator: re.Pattern) -> List[str]:
    """The worker's tokenizer: text between tags, split at `separator`, lower-cased."""
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    return [token.lower() for text in values for block in re.split(r"<[^>]*>", text)
            for token in separator.split(block) if token]


def _query(text: str, separator: re.Pattern) -> str:
    """The worker's `transformSearchQuery`: the query lunr is given for what the reader typed."""
    query = re.sub(r'"|(?:^|\s+)[*+\-:^~]+(?=\s+|$)', "", text.strip())
    terms = []
    for part in query.split():
        lexer = QueryLexer(part)
        lexer.run()
        for lexeme in lexer.lexemes:
            start, end = lexeme["start"], lexeme["end"]
            if lexeme["type"] == QueryLexer.FIELD and lexeme["string"] not in FIELDS:
                part = part[:end] + " " + part[end + 1:]
            elif lexeme["type"] == QueryLexer.TERM:
                terms += [part[:start] + piece + part[end:]
                          for piece in separator.split(lexeme["string"]) if piece]
    return " ".join(term if re.search(r"(^[+-]|[~^]\d+$)", term) else term + "*" for term in terms)


class SiteSearch:
    """The search of a built site, from its `search/search_index.json`."""

    def __init__(self, index_path: str):
        with open(index_path) as f:
            index = json.load(f)
        config = index["config"]
        self.separator = re.compile(config["separator"])
        self.docs = {doc["location"]: doc for doc in index["docs"]}
        builder = Builder()
        builder.b(0)
        if "stopWordFilter" in config["pipeline"]:
            builder.pipeline.add(stop_word_filter)
        builder.ref("location")
        for name, spec in config["fields"].items():
            builder.field(name, boost=spec.get("boost", 1),
                          extractor=lambda doc, name=name: _tokens(doc.get(name), self.separator))
        for doc in index["docs"]:
            builder.add(doc, {"boost": doc["boost"]} if "boost" in doc else None)
        self.index = builder.build()

    def pages(self, text: str) -> List[str]:
        """The pages (their locations, without an anchor) a search for `text` lists, best first."""
        query = _query(text, self.separator)
        if not query:
            return []
        clauses = [term.strip("*").lower() for term in query.split() if not term.startswith("-")]
        scored: Dict[str, float] = {}
        for result in self.index.search(query):
            location = result["ref"]
            matched = list(result["match_data"].metadata)
            found = {c for c in clauses if any(term.startswith(c) for term in matched)}
            counted = [c for c in clauses if c in found or stop_word_filter(c)]
            boost = ("#" not in location) + (len(found) / len(counted) if counted else 0)
            page = location.split("#")[0]
            scored[page] = max(scored.get(page, 0), result["score"] * (1 + boost ** 2))
        return sorted(scored, key=scored.get, reverse=True)
