"""The search tool: BM25 ranking on the bundled collection, top_k, custom collections, clear errors."""

from __future__ import annotations

import asyncio
import json

import pytest

from scaffold_core.errors import ConfigError
from scaffold_core.tool import ToolContext, check_tool, invoke_tool
from scaffold_tools.search import SearchTool, load_collection, sample_collection_path


def search(tool: SearchTool, query: str):
    return asyncio.run(invoke_tool(tool, {"query": query}, ToolContext("ep", "c")))


@pytest.fixture(scope="module")
def tool() -> SearchTool:
    return SearchTool()


@pytest.mark.parametrize("query, best", [
    ("how many feet are in a mile", "units-length-2"),
    ("capital of Japan", "geo-2"),
    ("ounces in a pound", "units-mass-1"),
    ("is 1900 a leap year", "time-4"),
    ("how many legs does a spider have", "animals-1"),
    ("boiling point of water in Fahrenheit", "science-1"),
    ("cards in a deck", "games-2"),
])
def test_the_best_passage_comes_first(tool, query, best):
    result = search(tool, query)
    assert result.ok, result.content
    assert result.metadata["ids"][0] == best
    assert result.content.startswith(f"[1] {best} | ")


def test_results_are_formatted_with_ids_titles_and_text(tool):
    result = search(tool, "mile feet")
    first = result.content.split("\n\n")[0]
    assert first.splitlines()[0] == "[1] units-length-2 | Mile"
    assert "5,280 feet" in first.splitlines()[1]
    scores = result.metadata["scores"]
    assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)


def test_top_k_bounds_the_number_of_passages():
    assert len(search(SearchTool(top_k=1), "water").metadata["ids"]) == 1
    five = search(SearchTool(top_k=5), "days in a year month week").metadata["ids"]
    assert len(five) == 5 and len(set(five)) == 5


def test_a_query_that_matches_nothing_says_so(tool):
    result = search(tool, "xylophone zeppelin")
    assert result.ok and result.content.startswith("No documents match") and result.metadata["ids"] == []
    assert search(tool, "the of and").content.startswith("No documents match")  # stopwords only


def test_bad_queries_are_bad_arguments(tool):
    assert asyncio.run(invoke_tool(tool, {}, ToolContext("ep", "c"))).error == "bad_arguments"
    assert search(tool, "").error == "bad_arguments"
    assert search(tool, "   ").error == "bad_arguments"
    assert search(SearchTool(max_query_chars=10), "a very long query indeed").error == "bad_arguments"


def test_a_custom_collection_with_other_field_names(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [{"doc_id": "a", "name": "Apples", "body": "Apples are red or green fruit."},
            {"doc_id": "b", "name": "Bananas", "body": "Bananas are long yellow fruit."},
            {"doc_id": "c", "name": "Carrots", "body": "Carrots are orange roots."}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    tool = SearchTool(path=str(path), id_field="doc_id", title_field="name", text_field="body", top_k=2)
    asyncio.run(tool.start())
    result = search(tool, "yellow fruit")
    assert result.metadata["ids"][0] == "b" and result.content.startswith("[1] b | Bananas\n")


def test_long_passages_are_cut(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"id": 1, "title": "Long", "text": "word " * 500}) + "\n", encoding="utf-8")
    result = search(SearchTool(path=str(path), max_chars=100), "word")
    body = result.content.splitlines()[1]
    assert len(body) == 100 and body.endswith("...")


def test_a_missing_collection_is_a_config_error_naming_the_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ConfigError, match="does not exist; set `path`") as info:
        SearchTool(path=str(missing))
    assert str(missing) in str(info.value)


@pytest.mark.parametrize("content, fragment", [
    ('{"id": 1, "text": "ok"}\n{not json}\n', ":2: not valid JSON"),
    ('[1, 2]\n', ":1: expected a JSON object"),
    ('{"id": 1, "body": "no text field"}\n', "no text in field 'text' (fields: body, id)"),
    ("\n\n", "has no documents"),
])
def test_an_unusable_collection_fails_at_start_with_the_line(tmp_path, content, fragment):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    tool = SearchTool(path=str(path))
    with pytest.raises(ConfigError) as info:
        asyncio.run(tool.start())
    assert fragment in str(info.value)
    # a call without start() reports the same problem as a failed result
    result = search(tool, "anything")
    assert result.error == "failed" and fragment in result.content


def test_the_index_is_built_once_and_shared_by_concurrent_calls():
    tool = SearchTool()

    async def main():
        return await asyncio.gather(*(invoke_tool(tool, {"query": q}, ToolContext("ep", str(i)))
                                      for i, q in enumerate(["mile", "capital of France", "chess board"] * 3)))

    results = asyncio.run(main())
    assert all(r.ok for r in results)
    index = tool._index
    assert index is not None
    search(tool, "moon")
    assert tool._index is index


def test_the_bundled_collection_is_package_data():
    documents = load_collection(sample_collection_path())
    assert len(documents) >= 30
    assert len({d.id for d in documents}) == len(documents)
    assert all(d.title and d.text for d in documents)


def test_definition_is_valid(tool):
    check_tool(tool)
    assert tool.spec()["function"]["parameters"]["required"] == ["query"]
