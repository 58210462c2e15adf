"""Constraints compiled on the host (``sampling.automaton``): patterns -> trimmed token-level
automata over a real vocabulary -> one ``ConstraintTable``; random walks through the table spell
only matches, every reachable state allows a token, EOS exactly where the output is complete."""

import json
import re

import numpy as np
import pytest
import requires
from standins import Spelled

import decodelab as dl
from decodelab.sampling import automaton, constraint
from decodelab.sampling.constraint import FREE
from decodelab.text import data

requires.importorskip("outlines_core", reason="constraints compile with outlines-core (the "
                                              "structured extra)")

V = 520  # the model's vocabulary, padded past both tokenizers' sizes
BYTE_LEVEL_TEXT = ["the café is naïve", "日本の猫 and the dog", "a cat, a dog: 2024-01-31"]


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus") / "hamlet.txt"
    corpus.write_text(data.split_documents("train")["hamlet"][:20000], encoding="utf-8")
    return dl.Tokenizer.train([corpus], vocab_size=400)


@pytest.fixture(scope="module")
def byte_level():
    """A byte-level BPE tokenizer (GPT-2's alphabet, SmolLM2's kind) of a few hundred pieces:
    its 256 single-byte pieces include the parts of every multi-byte UTF-8 character."""
    tokenizers = requires.importorskip("tokenizers", reason="a byte-level BPE tokenizer")
    backend = tokenizers.Tokenizer(tokenizers.models.BPE())
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    backend.train_from_iterator(BYTE_LEVEL_TEXT, tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    return dl.PretrainedTokenizer(backend, bos_id=None, eos_id=0)


def host_table(table):
    """The table as host dicts: the allowed ids of each state and the state after each."""
    Q = table.num_states
    mask = np.asarray(table.allowed_mask(np.arange(Q)))  # [Q, V]
    states, tokens = np.nonzero(mask)
    after = np.asarray(table.advance(states, tokens))
    moves = {q: {} for q in range(Q)}
    for q, t, n in zip(states.tolist(), tokens.tolist(), after.tolist()):
        moves[q][t] = n
    return moves, np.asarray(table.accepting)


def walks(table, start, eos, count=30, steps=120, seed=0):
    """Token lists of random walks from ``start`` that end with an EOS (each allowed token
    equally likely, an allowed EOS taken half the time); asserts along the way that every state
    reached allows a token and that EOS is allowed exactly in accepting states."""
    moves, accepting = host_table(table)
    rng = np.random.default_rng(seed)
    done = []
    for _ in range(count):
        state, out = start, []
        for _ in range(steps):
            allowed = sorted(moves[state])
            assert allowed, f"state {state} allows no token"
            assert (eos in moves[state]) == accepting[state]
            if eos in moves[state] and (rng.random() < 0.5 or allowed == [eos]):
                done.append(out)
                break
            token = int(rng.choice([t for t in allowed if t != eos]))
            out.append(token)
            state = moves[state][token]
    return done


PATTERNS = [r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"(yes|no)", r"(the|a) [a-z]{1,6}( (cat|dog))?",
            r"[A-Z][a-z]*(, [a-z]+)*\."]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_walks_through_a_sentencepiece_table_spell_only_matches(sentencepiece, pattern):
    table, starts = automaton.table([("regex", pattern)], sentencepiece, V, sentencepiece.eos_id)
    done = walks(table, int(starts[0]), sentencepiece.eos_id)
    assert len(done) >= 20
    for tokens in done:
        assert re.fullmatch(pattern, sentencepiece.decode(tokens)), sentencepiece.decode(tokens)


def test_tokens_that_are_parts_of_a_utf8_character_spell_a_non_ascii_match(byte_level):
    pattern = r"(café|naïve|日本)( [a-z]{1,4})?"
    table, starts = automaton.table([("regex", pattern)], byte_level, V, 0)
    done = walks(table, int(starts[0]), 0, count=60)
    spelled = byte_level.token_bytes()
    partial = [t for tokens in done for t in tokens if not _is_utf8(spelled[t])]
    assert partial, "no walk took a token that is part of a UTF-8 character"
    words = {byte_level.decode(tokens).split(" ")[0] for tokens in done}
    assert words == {"café", "naïve", "日本"}
    for tokens in done:
        assert re.fullmatch(pattern, byte_level.decode(tokens)), byte_level.decode(tokens)


def _is_utf8(spelled: bytes) -> bool:
    try:
        spelled.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_a_json_schema_walks_to_json_that_keeps_the_schema(sentencepiece):
    schema = {"type": "object", "properties": {
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
        "owner": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3}},
                  "required": ["name"]}}, "required": ["kind", "tags", "owner"]}
    table, starts = automaton.table([("json_schema", schema)], sentencepiece, V,
                                    sentencepiece.eos_id)
    done = walks(table, int(starts[0]), sentencepiece.eos_id, count=20, steps=200)
    assert len(done) >= 10
    for tokens in done:
        value = json.loads(sentencepiece.decode(tokens))
        assert list(value) == ["kind", "tags", "owner"] and value["kind"] in ("cat", "dog")
        assert len(value["tags"]) <= 2 and all(isinstance(t, int) for t in value["tags"])
        assert len(value["owner"]["name"]) <= 3


def test_no_reachable_state_allows_a_special_or_padding_id(sentencepiece):
    table, starts = automaton.table([("regex", PATTERNS[2]), None], sentencepiece, V,
                                    sentencepiece.eos_id)
    moves, accepting = host_table(table)
    assert starts[1] == FREE and len(moves[FREE]) == V  # a free row: every id, padding too
    seen, todo = {int(starts[0])}, [int(starts[0])]
    while todo:
        state = todo.pop()
        assert moves[state], f"state {state} allows no token"
        assert max(moves[state]) < sentencepiece.vocab_size
        assert not {sentencepiece.pad_id, sentencepiece.bos_id, sentencepiece.unk_id} & set(
            moves[state])
        assert (sentencepiece.eos_id in moves[state]) == accepting[state]
        for n in set(moves[state].values()) - seen:
            seen.add(n)
            todo.append(n)
    assert FREE not in seen


def test_a_state_no_accepting_state_follows_is_trimmed_with_the_moves_into_it():
    vocab = Spelled([None, b"a", b"b", b"c"])  # 0: EOS
    built = automaton.build("regex", "a*d|b", vocab, 4, 0)  # no "d": every "a" leads nowhere
    assert built.num_states == 2  # the start and the state after "b"
    assert sorted(built.token[built.source == 0].tolist()) == [2]
    assert built.accepting.tolist() == [False, True]
    assert list(zip(built.source.tolist(), built.token.tolist(), built.target.tolist())) == [
        (0, 2, 1), (1, 0, 1)]


def test_rows_with_one_pattern_share_its_states_and_the_cache_gives_the_same_automaton(
        sentencepiece):
    rows = [("regex", PATTERNS[0]), None, ("regex", PATTERNS[1]), ("regex", PATTERNS[0])]
    table, starts = automaton.table(rows, sentencepiece, V, sentencepiece.eos_id)
    assert starts[0] == starts[3] == 1 and starts[1] == FREE and starts[2] > 1
    first = automaton.build("regex", PATTERNS[1], sentencepiece, V, sentencepiece.eos_id)
    assert automaton.build("regex", PATTERNS[1], sentencepiece, V, sentencepiece.eos_id) is first
    used = int(starts[2]) + first.num_states  # the free state, then each pattern's states
    assert table.num_states == 1 << (used - 1).bit_length()  # padded to a power of two
    other, _ = automaton.table([("regex", r"[0-9]{4}/[0-9]{2}/[0-9]{2}")] + rows[1:],
                               sentencepiece, V, sentencepiece.eos_id)
    shapes = lambda t: [x.shape for x in (t.allowed, t.next_state, t.edge_keys)]  # noqa: E731
    assert shapes(other) == shapes(table)  # a pattern of similar size: the same program
    # A later batch with the same patterns in the same order reuses the device table; its rows'
    # starts are its own.
    again, again_starts = automaton.table([None, *rows[:1], *rows[2:]], sentencepiece, V,
                                          sentencepiece.eos_id)
    assert again is table and again_starts.tolist() == [FREE, 1, int(starts[2]), 1]
    swapped, _ = automaton.table(rows[2:], sentencepiece, V, sentencepiece.eos_id)
    assert swapped is not table  # another order of the patterns: another layout


def test_a_table_past_the_dense_budget_holds_the_same_moves_sparse(sentencepiece, monkeypatch):
    rows = [("regex", PATTERNS[2]), None, ("regex", PATTERNS[0])]
    dense, starts = automaton.table(rows, sentencepiece, V, sentencepiece.eos_id)
    monkeypatch.setattr(constraint, "MAX_DENSE_BYTES", 0)
    sparse, sparse_starts = automaton.table(rows, sentencepiece, V, sentencepiece.eos_id)
    assert not dense.sparse and sparse.sparse and sparse.next_state.shape == (0, V)
    assert sparse.nbytes < dense.nbytes
    np.testing.assert_array_equal(sparse_starts, starts)
    assert host_table(sparse)[0] == host_table(dense)[0]
    monkeypatch.setattr(constraint, "MAX_TABLE_BYTES", 1000)
    with pytest.raises(ValueError, match=r"takes \d+\.\d KiB, more than the 1000 B a batch's "
                                         r"table may take"):
        automaton.table(rows, sentencepiece, V, sentencepiece.eos_id)


@pytest.mark.parametrize("row, message", [
    (("regex", "(a"), r"\(regex '\(a'\) is not a regex outlines-core compiles"),
    (("regex", "a*d"), r"\(regex 'a\*d'\) cannot be completed: no token sequence of this "
                       r"vocabulary matches it from the start"),
    (("regex", "z"), r"\(regex 'z'\) cannot be spelled with this vocabulary's tokens"),
    (("json_schema", '{"type": '), r"\(json_schema '\{\"type\": '\) is not valid JSON"),
    (("json_schema", {"type": "tree"}), r"\(json_schema \{'type': 'tree'\}\) is a schema "
                                        r"outlines-core cannot compile \(.*tree"),
    (("grammar", "a"), r"kind must be one of \('regex', 'json_schema'\), got 'grammar'"),
])
def test_a_bad_constraint_is_refused_naming_its_row_and_pattern(row, message):
    vocab = Spelled([None, b"a", b"b", b"c"])
    with pytest.raises(ValueError, match=r"^constraints\[2\] " + message):
        automaton.table([None, ("regex", "a"), row], vocab, 4, 0)


def test_a_constraint_without_a_tokenizer_is_refused_naming_its_row_and_pattern():
    with pytest.raises(ValueError, match=r"^constraints\[1\] \(regex 'a'\) needs the model's "
                                         r"tokenizer.*got tokenizer=None"):
        automaton.table([None, ("regex", "a")], None, 4, 0)
    table, starts = automaton.table([None, None], None, 4, 0)  # no constraint: no tokenizer
    assert table.num_states == 1 and starts.tolist() == [FREE, FREE]
    with pytest.raises(ValueError, match=r"^eos_ids must name at least one"):
        automaton.table([("regex", "a")], Spelled([None, b"a"]), 4, [])


@pytest.mark.parametrize("which", ["sentencepiece", "byte_level"])
def test_token_bytes_spell_what_decode_gives(which, request):
    tokenizer = request.getfixturevalue(which)
    spelled = tokenizer.token_bytes()
    assert len(spelled) == tokenizer.vocab_size and spelled[tokenizer.eos_id] is None
    text = "the café, naïve 日本 dog\n 2024"
    ids = tokenizer.encode(text)
    assert b"".join(spelled[i] for i in ids).decode("utf-8") == tokenizer.decode(ids) == text


@pytest.mark.slow
def test_smollm2_json_schema_table_is_sparse_and_spells_valid_json(smollm2_installed):
    from decodelab.convert import gguf_tokenizer
    from decodelab.experiment import presets

    tokenizer = gguf_tokenizer(presets.pretrained_path(smollm2_installed))
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8}, "kind": {"enum": ["cat", "dog", "bird"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
        "owner": {"type": "object", "properties": {"age": {"type": "integer"}},
                  "required": ["age"]}}, "required": ["name", "kind", "tags", "owner"]}
    table, starts = automaton.table([("json_schema", schema), ("regex", r"[0-9]{2}-[0-9]{2}")],
                                    tokenizer, 49152, tokenizer.eos_id)
    assert table.sparse
    done = walks(table, int(starts[0]), tokenizer.eos_id, count=5, steps=300)
    assert done
    for tokens in done:
        assert json.loads(tokenizer.decode(tokens))["kind"] in ("cat", "dog", "bird")
    for tokens in walks(table, int(starts[1]), tokenizer.eos_id, count=10):
        assert re.fullmatch(r"[0-9]{2}-[0-9]{2}", tokenizer.decode(tokens))
