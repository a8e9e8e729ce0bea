from data.conversations import normalise, normalise_all
from data.sources import RawConversation
from data.tally import Tally


def raw(turns, index=0) -> RawConversation:
    return RawConversation("chats.jsonl", index, f"c{index}", turns)


def test_roles_are_normalised_and_unknown_roles_named():
    tally = Tally()
    conversation = normalise(
        raw(
            [
                ("system", "Be brief."),
                ("Human", "  hi  "),
                ("tool", "{}"),
                ("bing", "hello"),
                ("user", "more?"),
                ("model", "yes"),
                ("chatgpt", "and"),
                ("bard", "again"),
            ]
        ),
        tally,
    )
    assert [(m["role"], m["content"]) for m in conversation.messages] == [
        ("system", "Be brief."),
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "more?"),
        ("assistant", "yes"),
        ("assistant", "and"),
        ("assistant", "again"),
    ]
    assert tally.dropped_messages == {"unknown role 'tool'": 1}
    assert conversation.source == "chats.jsonl record 0 (id c0)"


def test_trailing_user_turns_and_leading_replies_are_dropped_and_counted():
    tally = Tally()
    conversation = normalise(
        raw([("gpt", "orphan reply"), ("human", "q"), ("gpt", "a"), ("human", "unanswered"), ("human", "")]),
        tally,
    )
    assert [m["content"] for m in conversation.messages] == ["q", "a"]
    assert tally.dropped_messages == {
        "assistant turn before the first user turn": 1,
        "turn after the last assistant turn": 1,
        "empty content": 1,
    }


def test_conversations_without_replies_are_dropped_and_counted():
    tally = Tally()
    assert normalise(raw([]), tally) is None
    assert normalise(raw([("human", "only a question")]), tally) is None
    assert normalise(raw([("human", "q"), ("gpt", "   ")]), tally) is None
    assert tally.dropped == {"empty conversation": 1, "no assistant turn": 2}
    assert tally.examples["no assistant turn"][0] == "chats.jsonl record 0 (id c0)"


def test_duplicates_are_removed_after_normalisation():
    tally = Tally()
    raws = [
        raw([("human", "q"), ("gpt", "a")], 0),
        raw([("user", " q "), ("assistant", "a\n")], 1),  # same turns once normalised
        raw([("human", "q"), ("gpt", "b")], 2),
    ]
    kept = list(normalise_all(raws, tally))
    assert [c.id for c in kept] == ["c0", "c2"]
    assert tally.duplicates == 1
