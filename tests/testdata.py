"""Prompts shared by the engine, integration and proposer tests: code (where prompt lookup and
learned proposers shine), prose, and short prompts."""

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(",
    "import os\nimport sys\nimport os\n",
    "for i in range(10):\n    print(i)\nfor i in range(",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "x = [1, 2, 3, 4, 5, 6, 7, 8]\ny = [1, 2, 3,",
    "if __name__ == '__main__':\n    main()\n",
    "return self._value",
]
