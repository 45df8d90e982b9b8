"""Which memory-file lines came from a forgotten turn, when the curator reworded it: a labelled set,
and the precision and recall of the dense rule (memory/forget_turns.py) at each threshold.

    python -m bench.forget_lines

Each case is a turn as a person said it (with the agent's answer), the learning the curator drew
from it, and the lines it wrote from it into the memory files, in other words than the turn's. Every
other case's lines, and lines of a memory file about other things (some on the same subjects: the
same city, the same person), are lines that did not come from it. A line is said to come from the
turn by the rule the forget applies: most of its words are the turn's, or its embedding is at least
the threshold close to the turn's or to its learning's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sprite_os.memory.forget_turns import DENSE_THRESHOLD, came_from, content_words


@dataclass(frozen=True)
class Case:
    turn: str
    learning: str
    lines: tuple[str, ...]


CASES = (
    Case("I live in Lisbon, in Alfama, since last spring.\nNoted: you live in Alfama, in Lisbon.",
         "The user lives in Alfama, Lisbon, since spring.",
         ("- Lives in Lisbon's Alfama", "- Home: Alfama district of Lisbon (moved in the spring)")),
    Case("My daughter Ana starts school on September 8th, she's so nervous.\nThat's a big day for Ana!",
         "The user's daughter Ana starts school on September 8.",
         ("- Daughter: Ana; first school day 8 Sep", "- Ana (daughter) begins school in early September")),
    Case("I'm allergic to penicillin, found out the hard way last year.\nI'll remember the penicillin allergy.",
         "The user is allergic to penicillin.",
         ("- Allergy: penicillin", "- Must avoid penicillin-based antibiotics")),
    Case("Please always answer me in Portuguese from now on.\nClaro, responderei em português.",
         "The user wants answers in Portuguese.",
         ("- Reply in Portuguese", "- Preferred language for answers: Portuguese")),
    Case("My accountant is Rui Costa, rui@costa-contas.pt, he handles my taxes.\nSaved Rui as your accountant.",
         "Rui Costa (rui@costa-contas.pt) is the user's accountant and handles taxes.",
         ("- Accountant: Rui Costa <rui@costa-contas.pt>", "- Taxes are done by Rui Costa")),
    Case("I quit my job at the bank, I'm freelancing as a translator now.\nCongratulations on going freelance!",
         "The user left a bank job and now works freelance as a translator.",
         ("- Works freelance: translation (formerly at a bank)", "- Career: ex-banker turned freelance translator")),
    Case("The lease on the flat ends March 31st 2027 and the landlord wants to raise the rent.\nI'll keep the date.",
         "The user's flat lease ends on 2027-03-31; the landlord plans a rent increase.",
         ("- Flat lease expires 2027-03-31", "- Landlord intends to increase rent at renewal")),
    Case("I run every Tuesday and Thursday morning along the river, about 8 km.\nNice routine!",
         "The user runs about 8 km on Tuesday and Thursday mornings by the river.",
         ("- Jogs 8 km by the river on Tue/Thu mornings", "- Exercise: running twice a week")),
    Case("Don't book me anything before 10am, I'm useless in the mornings.\nNo meetings before 10, got it.",
         "The user wants no appointments before 10:00.",
         ("- No meetings before 10:00", "- Not a morning person: schedule from 10 am")),
    Case("My partner is called Tomás and he's a chef at a restaurant in Porto.\nNice to know about Tomás.",
         "The user's partner Tomás is a chef in Porto.",
         ("- Partner: Tomás, chef (Porto restaurant)", "- Tomás cooks professionally in Porto")),
    Case("I'm saving for a car, budget around 15,000 euros, probably electric.\nI'll keep an eye out.",
         "The user is saving for an electric car, budget about 15,000 EUR.",
         ("- Saving up for an EV (~15k EUR)", "- Car budget: 15 000 €, electric preferred")),
    Case("Our cat Miso needs her vaccine booster in January.\nI'll remind you about Miso in January.",
         "The user's cat Miso is due a vaccine booster in January.",
         ("- Cat Miso: booster shot due in January", "- Pet: Miso (cat)")),
)

# Lines of memory files about other things, some on the same subjects as the cases.
OTHERS = (
    "- Visiting Lisbon in May for a conference", "- Prefers tea over coffee", "- Has a dog named Pip",
    "- Works as a nurse at Santa Maria hospital", "- Son: Pedro, 14, plays football",
    "- Likes Thai food, especially green curry", "- Uses a Mac at work and Linux at home",
    "- Birthday: 12 June", "- Wants summaries in bullet points", "- Reads science fiction before bed",
    "- Mother lives in Coimbra", "- Pays rent by bank transfer on the 1st", "- Drives a 2015 Golf",
    "- Dislikes phone calls; prefers email", "- Learning German on Duolingo",
    "- Dentist appointment every six months", "- Follows Benfica", "- Vegetarian since 2019",
    "- Project: renovating the kitchen", "- Timezone: Europe/Lisbon",
)


def evaluate(thresholds: list[float]) -> dict[str, Any]:
    """Each case against every line, by the rule the forget applies: most of the line's words in the
    turn (`came_from`), or its embedding within the threshold of the turn's or its learning's."""
    from sprite_os.memory.recall.dense import load

    model, status = load(None)
    assert model is not None, status.detail
    lines = [line for case in CASES for line in case.lines] + list(OTHERS)
    line_vectors = model.passages(lines)
    pairs: list[tuple[float, bool, bool]] = []  # (the nearest anchor's cosine, by words, a line of this case)
    for case in CASES:
        nearest = (line_vectors @ model.passages([case.turn, case.learning]).T).max(axis=1)
        words = content_words(case.turn)
        pairs += [(float(s), came_from(line, words), line in case.lines)
                  for s, line in zip(nearest, lines, strict=True)]
    out: dict[str, Any] = {"pairs": len(pairs), "reworded_lines": sum(p for _, _, p in pairs),
                           "words_alone": _score([(w, p) for _, w, p in pairs])}
    for t in thresholds:
        out[f"words_or_dense_{t:.2f}"] = _score([(w or s >= t, p) for s, w, p in pairs])
    return out


def _score(said: list[tuple[bool, bool]]) -> dict[str, Any]:
    tp = sum(1 for hit, pos in said if hit and pos)
    fp = sum(1 for hit, pos in said if hit and not pos)
    fn = sum(1 for hit, pos in said if pos and not hit)
    return {"precision": round(tp / (tp + fp), 3) if tp + fp else 1.0, "recall": round(tp / (tp + fn), 3),
            "false_positives": fp, "missed": fn}


def forget_lines() -> dict[str, Any]:
    return evaluate([round(DENSE_THRESHOLD + d, 2) for d in (-0.02, -0.01, 0.0, 0.01, 0.02)])


if __name__ == "__main__":
    print(json.dumps(forget_lines(), indent=1))
