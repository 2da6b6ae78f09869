"""What the real chat model is asked to write user requests about, for its EAGLE head's
training data (scripts/train_eagle.py, stage `prompts`).

Each category says, in one instruction, what kind of request the model should write, shows it
two worked examples as earlier chat turns (the model imitates their form), and lists topics; the
stage crosses categories with topics and samples the model's request. Chat categories cover
everyday requests as broadly as the programming ones cover code. Nothing here comes from a hub or
a published prompt set, and none of it is the held-out set (scripts/eagle_heldout.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Category:
    name: str
    kind: str  # "chat" or "code": how the data is split for evaluation
    instruction: str  # "{topic}" is replaced
    examples: tuple[tuple[str, str], ...]  # (topic, request) shown as earlier turns
    topics: tuple[str, ...]
    weight: int = 1  # requests per topic


EVERYDAY = (
    "cooking pasta", "baking bread", "growing tomatoes", "houseplants", "caring for a cat",
    "training a puppy", "keeping fish", "camping", "hiking in the mountains", "a beach holiday",
    "travelling by train", "learning a language", "public speaking", "writing a CV",
    "saving for a house", "budgeting", "credit cards", "buying a used car", "cycling to work",
    "yoga", "swimming", "healthy breakfasts", "drinking enough water", "morning routines",
    "time management", "working from home", "moving to a new city", "making friends",
    "birthday parties", "wedding speeches", "gift ideas", "cleaning the kitchen",
    "decorating a small room", "recycling", "saving energy at home", "rainy days",
    "thunderstorms", "the night sky", "autumn leaves", "spring flowers", "coffee", "green tea",
    "chocolate", "street food", "picnics", "board games", "video games", "reading novels",
    "learning guitar", "painting with watercolours", "photography", "museums", "libraries",
    "volunteering", "grandparents", "siblings", "school exams", "homework", "studying maths",
    "starting a small business", "customer service", "job interviews", "asking for a raise",
    "dealing with stress", "sleeping better", "running a marathon", "stretching", "first aid",
    "a cold", "allergies", "sunburn", "electric cars", "smartphones", "passwords",
    "online shopping", "social media", "podcasts", "movies", "music festivals", "dancing",
    "knitting", "woodworking", "fixing a bicycle", "a leaking tap", "painting a wall",
    "neighbours", "city parks", "farmers' markets", "bird watching", "the ocean", "rivers",
    "deserts", "volcanoes", "earthquakes", "rainforests", "polar bears", "honey bees",
    "dinosaurs", "the moon", "Mars", "black holes", "the human heart", "the brain", "bones",
    "digestion", "photosynthesis", "electricity", "magnets", "gravity", "light", "sound",
    "weather forecasts", "climate change", "the Roman Empire", "ancient Egypt", "the Vikings",
    "the printing press", "the industrial revolution", "the first flight", "the internet",
    "world capitals", "famous painters", "classical music", "the Olympic Games", "chess",
    "football", "tennis", "basketball", "mountains of the world", "islands", "languages of the "
    "world", "money and banks", "taxes", "voting", "newspapers", "advertising", "friendship",
    "kindness", "honesty", "motivation", "habits", "patience", "teamwork", "leadership",
)

CODE_TOPICS = (
    "lists", "dictionaries", "sets", "tuples", "strings", "string formatting", "slicing",
    "list comprehensions", "loops", "while loops", "recursion", "sorting", "searching",
    "reading files", "writing files", "CSV files", "JSON data", "dates and times",
    "random numbers", "classes", "inheritance", "exceptions", "generators", "iterators",
    "decorators", "lambda functions", "regular expressions", "command-line arguments",
    "unit tests", "logging", "HTTP requests", "stacks", "queues", "linked lists",
    "binary trees", "graphs", "matrices", "prime numbers", "Fibonacci numbers", "palindromes",
    "counting words", "temperature conversion", "unit conversion", "shopping carts",
    "to-do lists", "student grades", "bank accounts", "inventories", "passwords",
    "text statistics", "number formatting", "email validation", "phone numbers",
    "dates in a calendar", "file paths", "directories", "sorting dictionaries",
    "duplicates in a list", "merging lists", "flattening nested lists", "string reversal",
    "vowels and consonants", "averages", "maximum and minimum", "dice games", "tic-tac-toe",
    "a guessing game", "roman numerals", "binary numbers", "hexadecimal colours",
    "JavaScript arrays", "JavaScript objects", "JavaScript promises", "HTML forms",
    "CSS layouts", "SQL joins", "SQL grouping", "bash scripts", "git branches",
    "big-O complexity", "hash tables", "caching results", "threads", "async functions",
)

CATEGORIES = (
    Category(
        "writing", "chat",
        "Write one request a person might send to an assistant asking it to write something "
        "creative or practical about {topic}. Write only the request.",
        (("autumn", "Write a short poem about walking through a forest in autumn."),
         ("a lost wallet", "Write an email to a hotel asking whether they found my wallet.")),
        EVERYDAY),
    Category(
        "explanation", "chat",
        "Write one question a curious person might ask an assistant to explain something about "
        "{topic}. Write only the question.",
        (("rainbows", "How do rainbows form after it rains?"),
         ("bread", "Why does bread dough rise when you leave it in a warm place?")),
        EVERYDAY),
    Category(
        "advice", "chat",
        "Write one question a person might ask an assistant for advice about {topic}. Write only "
        "the question.",
        (("houseplants", "My houseplant's leaves are turning yellow. What should I do?"),
         ("studying", "How can I stay focused when I study in the evening?")),
        EVERYDAY),
    Category(
        "reasoning", "chat",
        "Write one short logic puzzle or reasoning question that involves {topic}. Write only the "
        "question.",
        (("apples", "If I have three apples and you take away two, how many apples do you have?"),
         ("a race", "In a race you overtake the person in second place. What place are you in "
                    "now?")),
        EVERYDAY[::3]),
    Category(
        "maths", "chat",
        "Write one short maths word problem about {topic} that an assistant could solve. Write "
        "only the problem.",
        (("a bakery", "A bakery sells 24 muffins a day. How many muffins does it sell in two "
                      "weeks?"),
         ("a garden", "A rectangular garden is 8 metres long and 5 metres wide. What is its "
                      "perimeter?")),
        EVERYDAY[1::3]),
    Category(
        "extraction", "chat",
        "Write one request asking an assistant to summarise, extract or list information from a "
        "short text about {topic}. Include the short text in the request.",
        (("a concert", "List the band names in this text: Tonight the Blue Owls open, followed "
                       "by Red Fern and the Night Trains."),
         ("a recipe", "Summarise in one sentence: Mix flour and eggs, add milk slowly, then fry "
                      "thin pancakes in butter.")),
        EVERYDAY[2::3]),
    Category(
        "role-play", "chat",
        "Write one request asking an assistant to pretend to be someone connected with {topic} "
        "and speak as them. Write only the request.",
        (("a zoo", "Pretend you are a zookeeper and tell me about your favourite animal."),
         ("space", "Act as an astronaut describing your first morning on the space station.")),
        EVERYDAY[::2]),
    Category(
        "general knowledge", "chat",
        "Write one general knowledge question about {topic}. Write only the question.",
        (("rivers", "Which is the longest river in Africa?"),
         ("inventions", "Who invented the telephone, and when?")),
        EVERYDAY),
    Category(
        "programming", "code",
        "Write one request a programmer might send to an assistant asking for code that uses "
        "{topic}. Write only the request.",
        (("strings", "Write a Python function that counts how many times each letter appears "
                     "in a word."),
         ("files", "Write a Python script that copies every line containing 'error' from one "
                   "file to another.")),
        CODE_TOPICS, weight=4),
    Category(
        "code questions", "code",
        "Write one question a programmer might ask an assistant about {topic}: explaining a "
        "concept, fixing a bug or comparing two ways of doing something. Write only the "
        "question.",
        (("loops", "Why does my Python for loop skip items when I remove them from the list?"),
         ("functions", "What is the difference between return and print in a Python "
                       "function?")),
        CODE_TOPICS, weight=2),
)
