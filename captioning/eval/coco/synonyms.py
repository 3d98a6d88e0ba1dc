"""Which COCO objects a caption names: the synonym list of CHAIR (Rohrbach et al., 2018, "Object
Hallucination in Image Captioning") and the paper's rules for reading a caption with it.

The list maps words and phrases ("man", "motorbike", "hot dog", "teddy bear") to the 80 COCO object
categories. It is the authors' data/synonyms.txt (github.com/LisaAnne/Hallucination, commit
6e4d33c, BSD 2-Clause), one category a line, its name first, as a table here; three slips of that
file are mended: items written after a double space (" motor bike", " cheesecake") never matched
there; "iPhone" could not match a lower-cased caption; repeated items are listed once.

Reading a caption follows the authors' utils/chair.py (CHAIR.caption_to_words): words made
singular ("dogs" -> "dog", "men" -> "man"), then phrases matched before single words, so that
"hot dog" is a hot dog and not a dog, "teddy bear" not a bear, "baby elephant" an elephant and not
a person, "passenger jet" an airplane, "train track" nothing; "seat" is not a chair in a caption
that names a toilet. Their code singularizes every word with pattern.en; here the plural forms of
the list's own words are spelled out (`singular`), which is all that matching needs.
"""

from __future__ import annotations

from collections.abc import Sequence

# category: the other words and phrases that name it (data/synonyms.txt).
SYNONYMS: dict[str, tuple[str, ...]] = {
    "person": (
        "girl", "boy", "man", "woman", "kid", "child", "chef", "baker", "people", "adult", "rider", "children", "baby",
        "worker", "passenger", "sister", "biker", "policeman", "cop", "officer", "lady", "cowboy", "bride", "groom",
        "male", "female", "guy", "traveler", "mother", "father", "gentleman", "pitcher", "player", "skier",
        "snowboarder", "skater", "skateboarder", "foreigner", "caller", "offender", "coworker", "trespasser", "patient",
        "politician", "soldier", "grandchild", "serviceman", "walker", "drinker", "doctor", "bicyclist", "thief",
        "buyer", "teenager", "student", "camper", "driver", "solider", "hunter", "shopper", "villager"),
    "bicycle": ("bike", "unicycle", "minibike", "trike"),
    "car": (
        "automobile", "van", "minivan", "sedan", "suv", "hatchback", "cab", "jeep", "coupe", "taxicab", "limo", "taxi"),
    "motorcycle": ("scooter", "motor bike", "motor cycle", "motorbike", "moped"),
    "airplane": ("jetliner", "plane", "air plane", "monoplane", "aircraft", "jet", "airbus", "biplane", "seaplane"),
    "bus": ("minibus", "trolley"),
    "train": ("locomotive", "tramway", "caboose"),
    "truck": ("pickup", "lorry", "hauler", "firetruck"),
    "boat": (
        "ship", "liner", "sailboat", "motorboat", "dinghy", "powerboat", "speedboat", "canoe", "skiff", "yacht",
        "kayak", "catamaran", "pontoon", "houseboat", "vessel", "rowboat", "trawler", "ferryboat", "watercraft",
        "tugboat", "schooner", "barge", "ferry", "sailboard", "paddleboat", "lifeboat", "freighter", "steamboat",
        "riverboat", "battleship", "steamship"),
    "traffic light": ("street light", "traffic signal", "stop light", "streetlight", "stoplight"),
    "fire hydrant": ("hydrant",),
    "stop sign": (),
    "parking meter": (),
    "bench": ("pew",),
    "bird": (
        "ostrich", "owl", "seagull", "goose", "duck", "parakeet", "falcon", "robin", "pelican", "waterfowl", "heron",
        "hummingbird", "mallard", "finch", "pigeon", "sparrow", "seabird", "osprey", "blackbird", "fowl", "shorebird",
        "woodpecker", "egret", "chickadee", "quail", "bluebird", "kingfisher", "buzzard", "willet", "gull", "swan",
        "bluejay", "flamingo", "cormorant", "parrot", "loon", "gosling", "waterbird", "pheasant", "rooster",
        "sandpiper", "crow", "raven", "turkey", "oriole", "cowbird", "warbler", "magpie", "peacock", "cockatiel",
        "lorikeet", "puffin", "vulture", "condor", "macaw", "peafowl", "cockatoo", "songbird"),
    "cat": ("kitten", "feline", "tabby"),
    "dog": (
        "puppy", "beagle", "pup", "chihuahua", "schnauzer", "dachshund", "rottweiler", "canine", "pitbull", "collie",
        "pug", "terrier", "poodle", "labrador", "doggie", "doberman", "mutt", "doggy", "spaniel", "bulldog", "sheepdog",
        "weimaraner", "corgi", "cocker", "greyhound", "retriever", "brindle", "hound", "whippet", "husky"),
    "horse": (
        "colt", "pony", "racehorse", "stallion", "equine", "mare", "foal", "palomino", "mustang", "clydesdale", "bronc",
        "bronco"),
    "sheep": ("lamb", "ram", "goat", "ewe"),
    "cow": ("cattle", "oxen", "ox", "calf", "holstein", "heifer", "buffalo", "bull", "zebu", "bison"),
    "elephant": (),
    "bear": ("panda",),
    "zebra": (),
    "giraffe": (),
    "backpack": ("knapsack",),
    "umbrella": (),
    "handbag": ("wallet", "purse", "briefcase"),
    "tie": ("bow", "bow tie"),
    "suitcase": ("suit case", "luggage"),
    "frisbee": (),
    "skis": ("ski",),
    "snowboard": (),
    "sports ball": ("ball",),
    "kite": (),
    "baseball bat": (),
    "baseball glove": (),
    "skateboard": (),
    "surfboard": ("longboard", "skimboard", "shortboard", "wakeboard"),
    "tennis racket": ("racket",),
    "bottle": (),
    "wine glass": (),
    "cup": (),
    "fork": (),
    "knife": ("pocketknife", "knive"),
    "spoon": (),
    "bowl": ("container",),
    "banana": (),
    "apple": (),
    "sandwich": ("burger", "sub", "cheeseburger", "hamburger"),
    "orange": (),
    "broccoli": (),
    "carrot": (),
    "hot dog": (),
    "pizza": (),
    "donut": ("doughnut", "bagel"),
    "cake": ("cheesecake", "cupcake", "shortcake", "coffeecake", "pancake"),
    "chair": ("seat", "stool"),
    "couch": ("sofa", "recliner", "futon", "loveseat", "settee", "chesterfield"),
    "potted plant": ("houseplant",),
    "bed": (),
    "dining table": ("table", "desk"),
    "toilet": ("urinal", "commode", "lavatory", "potty"),
    "tv": ("monitor", "televison", "television"),
    "laptop": ("computer", "notebook", "netbook", "lenovo", "macbook", "laptop computer"),
    "mouse": (),
    "remote": (),
    "keyboard": (),
    "cell phone": ("mobile phone", "phone", "cellphone", "telephone", "phon", "smartphone", "iphone"),
    "microwave": (),
    "oven": ("stovetop", "stove", "stove top oven"),
    "toaster": (),
    "sink": (),
    "refrigerator": ("fridge", "freezer"),
    "book": (),
    "clock": (),
    "vase": (),
    "scissors": (),
    "teddy bear": ("teddybear",),
    "hair drier": ("hairdryer",),
    "toothbrush": (),
}

# Phrases read as one word before the words are looked up (chair.py's double_word_dict): every phrase
# of the list names its category; an animal's "baby" or "adult" and a vehicle's "passenger" are not
# a person; "home plate" and "train track" name no object (not a train).
_ANIMALS = ("bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "animal", "cub")
PHRASES: dict[str, str] = {
    **{phrase: phrase for names in SYNONYMS.items() for phrase in (names[0], *names[1]) if " " in phrase},
    **{f"{age} {animal}": animal for animal in _ANIMALS for age in ("baby", "adult")},
    "passenger jet": "jet", "passenger train": "train",
    "bow tie": "tie", "toilet seat": "toilet",
    "home plate": "home plate", "train track": "train track",
}
_LONGEST = max(len(phrase.split()) for phrase in PHRASES)

# word or phrase -> its category
CATEGORY_OF: dict[str, str] = {name: category for category, others in SYNONYMS.items()
                               for name in (category, *others)}

# Plurals that no rule below spells: (singular, plural).
_IRREGULAR = (("person", "people"), ("mouse", "mice"), ("goose", "geese"), ("ox", "oxen"), ("calf", "calves"),
              ("thief", "thieves"), ("buffalo", "buffaloes"), ("sheep", "sheep"))


def _plurals(word: str) -> set[str]:
    """The plural forms of one of the list's words (English's regular rules, and the endings the
    authors' singularize also undoes: *man -> *men, *child -> *children, *knife -> *knives, *bus ->
    *busses)."""
    forms = {word + "s"}
    if word.endswith(("s", "x", "z", "ch", "sh", "o")):
        forms.add(word + "es")
    if word.endswith("y") and word[-2:-1] not in ("a", "e", "i", "o", "u"):
        forms.add(word[:-1] + "ies")
    if word.endswith("man"):
        forms.add(word[:-3] + "men")
    if word.endswith("child"):
        forms.add(word + "ren")
    if word.endswith("knife"):
        forms.add(word[:-2] + "ves")
    if word.endswith("bus"):
        forms.add(word + "ses")
    return forms


def _singular_table() -> dict[str, str]:
    words = {word for phrase in (*CATEGORY_OF, *PHRASES, *PHRASES.values()) for word in phrase.split()}
    table = {plural: singular for singular, plural in _IRREGULAR}
    for word in sorted(words):
        for plural in _plurals(word):
            table.setdefault(plural, word)
    # A form that is itself one of the list's words stays as it is ("skis", "people", "cattle").
    return {plural: word for plural, word in table.items() if plural not in words}


_SINGULAR = _singular_table()


def singular(word: str) -> str:
    """The list's own form of a plural of its words ("dogs" -> "dog", "women" -> "woman"); any
    other word as it is."""
    return _SINGULAR.get(word, word)


def caption_objects(words: Sequence[str]) -> list[tuple[int, str]]:
    """(position, category) for each mention of a COCO object in a caption's words (lower-cased
    tokens), in order; a phrase's position is its last word's ("dog" of "hot dog", the noun).

    >>> caption_objects("a man riding a motorbike next to two hot dogs".split())
    [(1, 'person'), (4, 'motorcycle'), (9, 'hot dog')]
    """
    words = [singular(word) for word in words]
    terms: list[tuple[int, str]] = []  # (position of its last word, word or phrase)
    start = 0
    while start < len(words):
        for size in range(_LONGEST, 1, -1):  # the longest phrase first: "stove top oven" before a word
            phrase = " ".join(words[start:start + size])
            if start + size <= len(words) and phrase in PHRASES:
                terms.append((start + size - 1, PHRASES[phrase]))
                start += size
                break
        else:
            terms.append((start, words[start]))
            start += 1
    if any(term == "toilet" for _, term in terms):  # "the seat of the toilet" names no chair (chair.py)
        terms = [(position, term) for position, term in terms if term != "seat"]
    return [(position, CATEGORY_OF[term]) for position, term in terms if term in CATEGORY_OF]
