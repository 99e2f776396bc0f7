import unittest

from calc import add, clamp, mul


class AddTests(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)
        self.assertEqual(add(-1, 1), 0)


class OtherTests(unittest.TestCase):
    def test_mul(self):
        self.assertEqual(mul(4, 5), 20)

    def test_clamp(self):
        self.assertEqual(clamp(12, 0, 10), 10)
