"""Seeded filler text: a fixed list of common English words, so prompts need no downloads.

Common short words are about one token each in every mainstream tokenizer; with capitals and
full stops, prose here measures about 1.1 tokens per word and JSON about 4 characters per token
(SmolLM2's tokenizer; larger vocabularies give a little less). The server's usage report gives
the exact count.
"""

from __future__ import annotations

import random

WORDS = tuple(
    """
    able about above across act add after again against age ago air all almost alone along
    already also always among amount animal answer any appear apple area arm around art ask
    away back ball bank base bed before begin behind bell best better between big bird black
    blue board boat body book both box boy bread bring brother brown build busy buy call calm
    came car card care carry case cat cause cell center chair chance change check child city
    class clean clear close cloud coast cold color come common cook cool copy corn corner cost
    count country course cover cross crowd cup cut dark data day deep desk detail door down
    draw dream dress drink drive drop dry each early earth east easy edge egg end enough enter
    even event ever every exact example eye face fact fair fall family far farm fast field
    figure file fill final find fine fire first fish floor flow flower follow food foot force
    forest form free fresh friend front fruit full game garden gate gentle gift girl give glass
    gold good grass great green ground group grow half hand happy hard head hear heart heat
    heavy help high hill hold home hope horse hot hour house idea inch iron island job join
    just keep key kind king know lake land large last late law lead leaf learn left less letter
    level light line list little live long look lost low machine main make map mark market
    match matter mean measure meet metal middle might mile milk mind minute miss model moment
    money month moon morning mother mountain move music name near need never new next night
    north note number ocean offer office often oil old open order other page paint pair paper
    part party pass path pattern people pick piece place plan plant play point pool poor port
    power press price print problem quick quiet race rain raise reach read ready record red
    region rest rich ride right ring river road rock room root round rule run safe sail salt
    same sand save scale school science sea season seat second seed sell send sense serve set
    shape share ship shore short show side sign silver simple sing sister size sky sleep slow
    small smile snow soft soil song sound south space speak special speed spring square stand
    star start state station stay steel step stone stop store story street strong study sugar
    summer sun system table tail take talk teach team test thick thin thing think third tiny
    today tool top town track trade train travel tree true turn under unit until upon usual
    valley value village visit voice wait walk wall warm watch water wave way weather week
    weight west wheel white whole wide wild wind window winter wire wise wood word work world
    write yard year yellow young
    """.split()
)


TOKENS_PER_WORD = 1.1
CHARS_PER_JSON_TOKEN = 4.0


def words_for(tokens: int) -> int:
    """Words of prose that make about `tokens` tokens."""
    return max(1, round(tokens / TOKENS_PER_WORD))


def json_tokens(text: str) -> int:
    return round(len(text) / CHARS_PER_JSON_TOKEN)


class TextGen:
    """Deterministic sentences from a seed; one instance per independent text stream."""

    def __init__(self, seed: int | str) -> None:
        self._rng = random.Random(seed)

    def words(self, n: int) -> list[str]:
        return self._rng.choices(WORDS, k=max(0, n))

    def prose(self, n_tokens: int) -> str:
        """About `n_tokens` tokens of sentences."""
        return self.text(words_for(n_tokens))

    def text(self, n_words: int) -> str:
        """Exactly `n_words` words (at least 1) as sentences of 6-14 words."""
        out: list[str] = []
        left = max(1, n_words)
        while left > 0:
            k = min(left, self._rng.randint(6, 14))
            words = self.words(k)
            out.append(" ".join(words).capitalize() + ".")
            left -= k
        return " ".join(out)

    def name(self) -> str:
        return "_".join(self.words(2))

    def randint(self, lo: int, hi: int) -> int:
        return self._rng.randint(lo, hi)

    def shuffle(self, items: list) -> None:
        self._rng.shuffle(items)
