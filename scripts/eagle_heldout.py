"""Held-out prompts for the EAGLE heads fitted to the real chat model (scripts/train_eagle.py).

Written by hand for evaluation only, in the style of MT-bench's categories (writing, role-play,
reasoning, maths, extraction, science, humanities, coding), independently of the topic list the
training prompts are generated from. The training script refuses to train on a prompt that shares
a long word sequence with any of these (stage `prompts`, and tests/scripts/test_eagle_ttt.py),
so every number measured on them is on unseen requests. Each goes through the model's own chat
template as one user turn.
"""

from __future__ import annotations

CHAT = [
    # writing
    "Write a short thank-you note to a neighbour who watered my plants while I was away.",
    "Compose a four-line poem about the first snowfall of the year.",
    "Draft a friendly message inviting my team to a picnic on Saturday.",
    "Write the opening paragraph of a mystery story set on a night train.",
    "Write a product description for a reusable water bottle that keeps drinks cold.",
    # role-play
    "Pretend you are a tour guide in Rome and welcome a group of visitors.",
    "You are a patient piano teacher. How would you encourage a student who wants to quit?",
    "Act as a ship's captain announcing that a storm is coming.",
    "Imagine you are a librarian. Recommend three books to a teenager who likes adventure.",
    "Play the role of a coach giving a pep talk before a football final.",
    # reasoning
    "If all roses are flowers and some flowers fade quickly, can we say some roses fade quickly?",
    "Tom is taller than Anna, and Anna is taller than Ben. Who is the shortest?",
    "A farmer has chickens and cows, 10 heads and 28 legs in total. How many cows are there?",
    "Which is heavier, a kilogram of feathers or a kilogram of iron? Explain.",
    "What comes next in the sequence 2, 6, 12, 20, 30, and why?",
    # maths
    "What is 15 percent of 240?",
    "A train travels 180 km in 2 hours. What is its average speed?",
    "Solve for x: 3x + 7 = 22.",
    "What is the area of a circle with a radius of 5 cm?",
    "If a shirt costs 40 dollars and is discounted by 25 percent, what is the new price?",
    # extraction
    "Extract the names of the cities from this sentence: Maria flew from Lisbon to Oslo, "
    "then took a train to Stockholm.",
    "From the text 'The meeting is on 12 March at 3 pm in room B', list the date, time and "
    "place.",
    "Summarise this in one sentence: Bees pollinate many crops, and without them farmers would "
    "harvest far less fruit.",
    "Find the verbs in the sentence: The children ran to the park and played until sunset.",
    "Pull out every number from this text: We sold 35 apples, 12 pears and 8 melons today.",
    # science and technology
    "Why do we have seasons on Earth?",
    "How does a vaccine help the body fight a disease?",
    "What is the difference between a virus and a bacterium?",
    "Explain how solar panels turn sunlight into electricity.",
    "Why does ice float on water?",
    # humanities and everyday life
    "What were the main causes of the French Revolution?",
    "Why is sleep important for teenagers?",
    "Give me some tips for saving money on groceries.",
    "What makes a good friend?",
    "How can I prepare for a job interview?",
    "What is the role of a museum in a city?",
    "Describe the main ideas of democracy in a few sentences.",
    "How do I start running if I have never exercised before?",
    "What should I think about before adopting a dog?",
    "Why do people celebrate the new year?",
]

CODE = [
    "Write a Python function that returns the sum of the digits of an integer.",
    "Write a Python function that checks whether a year is a leap year.",
    "Write a Python function that returns the second largest number in a list.",
    "Write a Python function that capitalises the first letter of every word in a string.",
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function that returns the factorial of n using recursion.",
    "Write a Python function that computes the greatest common divisor of two numbers.",
    "Write a Python function that transposes a matrix given as a list of lists.",
    "Write a Python function that checks if two strings are anagrams.",
    "Write a Python function that converts a binary string to an integer without int().",
    "Write a Python function that rotates a list to the right by k steps.",
    "Write a Python function that returns the longest word in a sentence.",
    "Write a Python class for a bank account with deposit and withdraw methods.",
    "Write a Python function that groups a list of words by their first letter.",
    "Write a Python function that computes a running average of a list of numbers.",
    "Write a Python script that prints a multiplication table from 1 to 9.",
    "Write a Python function that validates an email address with a regular expression.",
    "Write a Python function that returns the intersection of two lists without duplicates.",
    "Write a Python function that reads a text file and returns the number of lines.",
    "Write a Python function that finds the missing number in a list of 1 to n.",
    "Write a Python generator that yields the squares of the numbers from 1 to n.",
    "Write a Python function that sorts a list of tuples by their second element.",
    "Write a Python function that implements binary search on a sorted list.",
    "Write a Python function that removes all whitespace from a string.",
    "Write a Python function that returns a dictionary counting each character in a string.",
    "Write a JavaScript function that returns the maximum value in an array.",
    "Write a JavaScript function that reverses a string.",
    "Write an SQL query that returns the ten most expensive products from a products table.",
    "Write an SQL query that counts the orders per customer.",
    "Write a bash command that finds all .txt files in the current directory tree.",
    "Explain what this Python code does: print([x * x for x in range(5) if x % 2 == 0])",
    "Find the bug in this Python code: def add(a, b): return a - b",
    "What is the difference between a list and a tuple in Python?",
    "How do I handle a missing key in a Python dictionary?",
    "Explain what a Python decorator is with a small example.",
    "Write a Python function that merges two dictionaries, summing the values of shared keys.",
    "Write a Python function that checks whether a number is a perfect square.",
    "Write a Python function that splits a list into chunks of size n.",
    "Write a Python function that returns the number of days between two dates.",
    "Write a Python function that converts a string to snake_case from camelCase.",
]
